// What the server refuses, and how the refusal reaches a user: a policy it does not offer, a flag
// that loosens the policy, a bind outside what it permits, a peer uid it does not allow. Each is
// exit 125 with the reason from the CLI, and nothing runs anywhere else.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grp.h>

#include "../cli/cli_test_util.hpp"
#include "rlm_sandbox/client.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

class ServerRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chmod(dir_.path().c_str(), 0755);  // the unprivileged peer must reach the socket
    server_ = std::make_unique<ServerUnderTest>(
        dir_, std::vector<std::string>{"--pool", "default=0", "--socket-mode", "0666",
                                       "--permit-bind", "0:" + dir_.path()});
    ASSERT_TRUE(server_->ready()) << server_->log();
  }
  TempDir dir_;
  std::unique_ptr<ServerUnderTest> server_;
};

TEST_F(ServerRefusalTest, PolicyNotOfferedExits125WithTheReason) {
  const auto marker = dir_.file("ran");
  auto outcome = cli({"run", "--server", server_->socket(), "--policy", "strict", "--", "/bin/sh",
                      "-c", "echo > " + marker});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("'strict' is not offered"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("default"), std::string::npos) << "names what is offered";
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(ServerRefusalTest, EnvironmentVariableNamesTheServerToo) {
  ProcessOptions options;
  options.extra_env["RLM_SANDBOX_SERVER"] = server_->socket();
  auto outcome = cli({"run", "--policy", "strict", "--", "/bin/true"}, options);
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("not offered"), std::string::npos) << outcome.err;
}

TEST_F(ServerRefusalTest, NoServerAtTheSocketExits125AndNeverRunsElsewhere) {
  const auto marker = dir_.file("ran");
  auto outcome =
      cli({"run", "--server", dir_.file("nobody.sock"), "--", "/bin/sh", "-c", "echo > " + marker});
  EXPECT_EQ(outcome.exit_code, 125);
  EXPECT_NE(outcome.err.find("no server at"), std::string::npos) << outcome.err;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(ServerRefusalTest, LooseningFlagExits125NamingTheLimit) {
  auto outcome = cli({"run", "--server", server_->socket(), "--memory", "64G", "--", "/bin/true"});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("limits.memory_bytes"), std::string::npos) << outcome.err;
}

TEST_F(ServerRefusalTest, LoosenedPolicyFromTheLibraryIsRefusedWithDiagnostics) {
  ServerConnection connection(server_->socket());
  Policy policy = connection.policy("default");
  policy.limits.memory_bytes *= 4;
  policy.namespaces.ipc = false;
  Request request;
  request.argv = {"/bin/true"};
  try {
    ServerConnection(server_->socket()).run(request, "default", &policy);
    FAIL() << "a loosened policy ran";
  } catch (const ServerRefused& refused) {
    EXPECT_EQ(refused.kind(), "refused");
    ASSERT_FALSE(refused.diagnostics().empty());
    std::string paths;
    for (const auto& d : refused.diagnostics()) paths += d.path + " ";
    EXPECT_NE(paths.find("limits.memory_bytes"), std::string::npos) << refused.what();
    EXPECT_NE(paths.find("namespaces.ipc"), std::string::npos) << refused.what();
  }
}

TEST_F(ServerRefusalTest, BindOutsideWhatIsPermittedExits125) {
  auto outcome =
      cli({"run", "--server", server_->socket(), "--bind-ro", "/etc:/mnt/etc", "--", "/bin/true"});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("refused"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("filesystem.mounts"), std::string::npos) << outcome.err;
}

TEST_F(ServerRefusalTest, PermittedBindRuns) {
  dir_.write("data.txt", "permitted\n");
  auto outcome = cli({"run", "--server", server_->socket(), "--bind-ro", dir_.path() + ":/mnt/data",
                      "--", "/bin/cat", "/mnt/data/data.txt"});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "permitted\n");
}

TEST_F(ServerRefusalTest, PeerUidNotAllowedIsRefusedNamingTheUid) {
  int err_pipe[2];
  ASSERT_EQ(pipe2(err_pipe, O_CLOEXEC), 0);
  const auto marker = dir_.file("ran-as-nobody");
  const std::string binary = bin_path("rlm-sandbox");
  const pid_t child = fork();
  if (child == 0) {
    dup2(err_pipe[1], 2);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(99);
    execl(binary.c_str(), binary.c_str(), "run", "--server", server_->socket().c_str(), "--",
          "/bin/sh", "-c", ("echo > " + marker).c_str(), nullptr);
    _exit(98);
  }
  close(err_pipe[1]);
  std::string err;
  char buffer[4096];
  for (ssize_t n; (n = read(err_pipe[0], buffer, sizeof buffer)) > 0;) err.append(buffer, n);
  close(err_pipe[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 98) << "nobody cannot execute " << binary;
  EXPECT_EQ(WEXITSTATUS(status), 125) << err;
  EXPECT_NE(err.find("uid 65534"), std::string::npos) << err;
  EXPECT_NE(err.find("not allowed"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(ServerAllowList, AllowedUidIsServed) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir,
                         {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  const std::string binary = bin_path("rlm-sandbox");
  const pid_t child = fork();
  if (child == 0) {
    const int null = open("/dev/null", O_RDWR);
    dup2(null, 1);
    dup2(null, 2);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(99);
    execl(binary.c_str(), binary.c_str(), "run", "--server", server.socket().c_str(), "--",
          "/bin/sh", "-c", "exit 7", nullptr);
    _exit(98);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7) << server.log();
}

}  // namespace
}  // namespace rlm::test
