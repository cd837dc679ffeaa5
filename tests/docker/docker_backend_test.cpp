// What a payload sees in a docker backend container, and what comes back: output, exit codes,
// stdin, the policy's user, environment, filesystem and network.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "docker_test_util.hpp"
#include "exit_status.hpp"
#include "host/unique_fd.hpp"

namespace rlm::test {
namespace {

TEST(DockerBackend, EchoRoundTripWithExitCode) {
  REQUIRE_DOCKER();
  const auto result = run_docker_sh("echo hello from docker; echo to stderr >&2; exit 3");
  EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.signal, 0);
  EXPECT_EQ(result.stdout_data, "hello from docker\n");
  EXPECT_EQ(result.stderr_data, "to stderr\n");
  EXPECT_EQ(result.backend, "docker");
  EXPECT_EQ(cli::exit_status(result), 3);

  const auto ok = run_docker({"echo", "-n", "no newline"}, busybox_policy());
  EXPECT_EQ(ok.status, Status::ok) << describe(ok);
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_EQ(ok.stdout_data, "no newline");
}

TEST(DockerBackend, RunsTheHostPythonThroughTheDefaultPolicysBinds) {
  REQUIRE_DOCKER();
  Request request;
  request.code = "import os, sys; print(os.getuid(), os.getgid(), sys.version_info[0])";
  request.language = "python";
  const auto result = docker::make_docker_backend()->run(request, docker_policy());
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "1000 1000 3\n");
}

TEST(DockerBackend, FeedsStdinFromDataAndFromAnFd) {
  REQUIRE_DOCKER();
  Request request;
  request.stdin_data = "line one\nline two\n";
  const auto from_data = run_docker({"cat"}, busybox_policy(), request);
  EXPECT_EQ(from_data.status, Status::ok) << describe(from_data);
  EXPECT_EQ(from_data.stdout_data, "line one\nline two\n");

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  host::UniqueFd read_end(fds[0]), write_end(fds[1]);
  const std::string big(200'000, 'z');  // more than one pipe and one socket buffer
  std::thread writer([&] {
    std::string_view rest = big;
    while (!rest.empty()) {
      const ssize_t n = write(write_end.get(), rest.data(), rest.size());
      if (n <= 0) break;
      rest.remove_prefix(static_cast<size_t>(n));
    }
    write_end.reset();
  });
  Request piped;
  piped.stdin_fd = read_end.get();
  const auto from_fd = run_docker_sh("wc -c", busybox_policy(), piped);
  writer.join();
  EXPECT_EQ(from_fd.status, Status::ok) << describe(from_fd);
  EXPECT_EQ(from_fd.stdout_data.substr(from_fd.stdout_data.find_first_not_of(' ')), "200000\n");

  const auto no_stdin = run_docker_sh("cat; echo end");
  EXPECT_EQ(no_stdin.stdout_data, "end\n") << "without stdin the payload reads EOF at once";
}

TEST(DockerBackend, ThePayloadGetsExactlyThePolicysEnvironmentAndIdentity) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.env.set = {{"PATH", "/bin"}, {"FROM_POLICY", "yes"}};
  policy.hostname = "box-under-test";
  setenv("RLM_DOCKER_TEST_SECRET", "host-only", 1);
  Request request;
  request.env = {{"FROM_REQUEST", "1"}};
  const auto result = run_docker_sh("id -u; id -g; hostname; pwd; env | sort", policy, request);
  unsetenv("RLM_DOCKER_TEST_SECRET");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("1000\n1000\nbox-under-test\n/tmp\n"), std::string::npos)
      << result.stdout_data;
  EXPECT_NE(result.stdout_data.find("FROM_POLICY=yes\n"), std::string::npos);
  EXPECT_NE(result.stdout_data.find("FROM_REQUEST=1\n"), std::string::npos);
  EXPECT_EQ(result.stdout_data.find("RLM_DOCKER_TEST_SECRET"), std::string::npos)
      << "nothing from the host's environment: " << result.stdout_data;
}

TEST(DockerBackend, AWriteToTheRootFails) {
  REQUIRE_DOCKER();
  const auto result =
      run_docker_sh("echo x > /probe && echo wrote /probe; echo y > /tmp/ok && cat /tmp/ok");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "y\n") << "the root is read-only, /tmp a writable tmpfs";
  EXPECT_NE(result.stderr_data.find("Read-only file system"), std::string::npos)
      << result.stderr_data;
}

TEST(DockerBackend, WithoutCapabilitiesAndWithTheSeccompProfile) {
  REQUIRE_DOCKER();
  // unshare is denied by the mandatory seccomp preamble: EPERM, the call never runs.
  const auto result = run_docker({"python3", "-c",
                                  "import ctypes, os\n"
                                  "print(open('/proc/self/status').read().split('CapEff:')[1]"
                                  ".split()[0])\n"
                                  "libc = ctypes.CDLL(None, use_errno=True)\n"
                                  "print(libc.unshare(0x20000), ctypes.get_errno())\n"
                                  "print(open('/proc/self/status').read().split('NoNewPrivs:')[1]"
                                  ".split()[0])\n"});
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "0000000000000000\n-1 1\n1\n");
}

// A listener on the host's loopback, and whether a payload can reach it.
class HostListener {
 public:
  HostListener() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address);
    socklen_t length = sizeof address;
    getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    listen(fd_.get(), 8);
  }
  int port() const { return port_; }

 private:
  host::UniqueFd fd_;
  int port_ = 0;
};

TEST(DockerBackend, TheNetworkIsUnreachableUnderNetworkNone) {
  REQUIRE_DOCKER();
  HostListener listener;
  const std::string probe =
      "import os, socket\n"
      "print(sorted(os.listdir('/sys/class/net')))\n"
      "try:\n"
      "    socket.create_connection(('127.0.0.1', " +
      std::to_string(listener.port()) +
      "), timeout=3)\n"
      "    print('connected')\n"
      "except OSError as e:\n"
      "    print('refused' if isinstance(e, ConnectionRefusedError) else repr(e))\n";
  const auto isolated = run_docker({"python3", "-c", probe});
  EXPECT_EQ(isolated.status, Status::ok) << describe(isolated);
  EXPECT_EQ(isolated.stdout_data, "['lo']\nrefused\n")
      << "only a loopback of its own: the host's listener is out of reach";

  // The same probe with the host's network reaches it, so the probe can tell.
  Policy host = docker_policy();
  host.network = Network::host;
  host.namespaces.net = false;
  const auto shared = run_docker({"python3", "-c", probe}, host);
  EXPECT_EQ(shared.status, Status::ok) << describe(shared);
  EXPECT_NE(shared.stdout_data.find("connected"), std::string::npos) << describe(shared);
}

TEST(DockerBackend, TheContainerIsRemovedAfterEveryRun) {
  REQUIRE_DOCKER();
  for (const auto* script : {"true", "exit 7", "kill -9 $$"}) {
    const auto result = run_docker_sh(script);
    EXPECT_NE(result.status, Status::sandbox_error) << describe(result);
  }
  EXPECT_TRUE(containers_of_this_process().empty());
}

bool lists(const std::vector<std::string>& fields, const std::string& field) {
  return std::find(fields.begin(), fields.end(), field) != fields.end();
}

// A Result says what health says of the user namespace (a daemon without userns-remap runs the
// payload as a host uid), and a payload that exits at once is not taken for one whose cgroup
// this process cannot read: here it can, so limits.cpu_time_ms is enforced on every run.
TEST(DockerBackend, ResultsListWhatTheDaemonCannotEnforceAndNothingElse) {
  REQUIRE_DOCKER();
  const Health health = docker::make_docker_backend()->health();
  ASSERT_TRUE(health.available) << health.detail;
  const bool no_userns = lists(health.unenforced, "namespaces.user");
  ASSERT_TRUE(no_userns || lists(health.enforced, "namespaces.user")) << health.detail;
  const Policy policy = busybox_policy();
  ASSERT_TRUE(policy.namespaces.user);
  for (int run = 0; run < 6; ++run) {
    const auto result = run_docker_sh(run % 2 ? "exit 0" : "echo quick", policy);
    EXPECT_EQ(result.status, Status::ok) << describe(result);
    EXPECT_EQ(lists(result.unenforced, "namespaces.user"), no_userns) << describe(result);
    EXPECT_FALSE(lists(result.unenforced, "limits.cpu_time_ms")) << run << describe(result);
  }
  // A policy without a user namespace asks for none: nothing to report.
  Policy without = policy;
  without.namespaces.user = false;
  const auto result = run_docker_sh("true", without);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_FALSE(lists(result.unenforced, "namespaces.user")) << describe(result);
}

}  // namespace
}  // namespace rlm::test
