// rlm-sandbox-init's await mode on its own (rlm_init/protocol.hpp): it starts nothing until a
// whole, well-formed payload message has arrived; the message alone says what runs, where, with
// which environment, limits and fds; and once its host's end of the socket closes, nothing it
// started survives.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "rlm_init/protocol.hpp"
#include "supervisor/init.hpp"
#include "support/host_probes.hpp"
#include "support/subprocess.hpp"

extern char** environ;

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Init started with --report-fd 3 --await-payload 4, as a plain child of this process.
class AwaitingInit {
 public:
  explicit AwaitingInit(std::vector<std::string> extra = {}) {
    int sockets[2], report[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
    EXPECT_EQ(pipe2(report, O_CLOEXEC), 0);
    std::vector<std::string> args{bin_path("rlm-sandbox-init"), "--report-fd", "3",
                                  "--await-payload", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    // Init's ends onto 3 and 4 from copies above both, so neither dup2 overwrites the other's.
    const int report_copy = fcntl(report[1], F_DUPFD_CLOEXEC, 10);
    const int socket_copy = fcntl(sockets[1], F_DUPFD_CLOEXEC, 10);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, report_copy, 3);
    posix_spawn_file_actions_adddup2(&actions, socket_copy, 4);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    for (int fd : {report_copy, socket_copy, sockets[1], report[1]}) close(fd);
    host_ = sockets[0];
    report_ = report[0];
  }
  ~AwaitingInit() {
    close_host();
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait_exit();
    }
    close(report_);
  }

  int host() const { return host_; }
  pid_t pid() const { return pid_; }
  void close_host() {
    if (host_ >= 0) close(std::exchange(host_, -1));
  }
  void send(const supervisor::PayloadMessage& message) {
    supervisor::send_payload_message(host_, message, Clock::now() + 5s);
  }
  // Init's exit status (waits at most 10 s, then kills it).
  int wait_exit() {
    int status = 0;
    const auto until = Clock::now() + 10s;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() >= until) kill(pid_, SIGKILL);
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string report() { return read_to_eof(report_); }
  int report_fd() const { return report_; }

 private:
  pid_t pid_ = -1;
  int host_ = -1, report_ = -1;
};

supervisor::PayloadMessage touching(const TempDir& dir) {
  supervisor::PayloadMessage message;
  message.argv = {"/bin/sh", "-c", "touch " + dir.file("started")};
  message.environment = {"PATH=/usr/bin:/bin"};
  return message;
}

// One line from `fd` (without waiting for EOF), or what came before `limit` ran out.
std::string read_line(int fd, std::chrono::milliseconds limit) {
  std::string line;
  test::read_until(fd, line, "\n", limit);
  return line;
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

TEST(InitAwait, EndOfFileBeforeTheMessageStartsNothing) {
  AwaitingInit init;
  init.close_host();
  EXPECT_EQ(init.wait_exit(), init_protocol::kInitFailureExit);
  EXPECT_NE(
      init.report().find("\"init_error\":\"the host closed the socket before sending a payload"),
      std::string::npos);

  // Half a message, then the host is gone: the command in it never runs.
  TempDir dir;
  AwaitingInit half;
  const auto bytes = supervisor::encode_payload_message(touching(dir));
  ASSERT_EQ(write(half.host(), bytes.data(), bytes.size() - 4),
            static_cast<ssize_t>(bytes.size() - 4));
  std::this_thread::sleep_for(100ms);
  half.close_host();
  EXPECT_EQ(half.wait_exit(), init_protocol::kInitFailureExit);
  EXPECT_NE(half.report().find("ends early"), std::string::npos);
  EXPECT_FALSE(exists(dir.file("started")));
}

TEST(InitAwait, AMalformedMessageStartsNothing) {
  TempDir dir;
  const auto good = supervisor::encode_payload_message(touching(dir));
  struct Case {
    std::string name, bytes, error;
  };
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  std::string more_strings = good;  // one string more than announced
  more_strings.replace(4, 4, std::string("\x00\x00\x00\x00", 4));
  auto header_says = [&](int word, std::uint32_t value) {
    std::string bytes = good;
    bytes.replace(static_cast<std::size_t>(word) * 4, 4, reinterpret_cast<const char*>(&value), 4);
    return bytes;
  };
  const Case cases[] = {
      {"magic", bad_magic, "magic"},
      {"empty body", header_says(1, 0), "body size"},
      {"huge body", header_says(1, 1u << 30), "body size"},
      {"argc 0", header_says(2, 0), "count"},
      {"more strings than announced", header_says(2, 1), "more strings"},
      {"fewer strings than announced", header_says(2, 9), "fewer strings"},
      {"stdio without fds", header_says(6, init_protocol::kPayloadStdio), "descriptors"},
      {"unknown flag", header_says(6, 1u << 7), "flags"},
  };
  for (const auto& c : cases) {
    AwaitingInit init;
    ASSERT_EQ(write(init.host(), c.bytes.data(), c.bytes.size()),
              static_cast<ssize_t>(c.bytes.size()));
    EXPECT_EQ(init.wait_exit(), init_protocol::kInitFailureExit) << c.name;
    const auto report = init.report();
    EXPECT_NE(report.find("init_error"), std::string::npos) << c.name << ": " << report;
    EXPECT_NE(report.find(c.error), std::string::npos) << c.name << ": " << report;
    EXPECT_FALSE(exists(dir.file("started"))) << c.name;
  }
  // The same message, well-formed, does run: the cases above failed for what they changed.
  AwaitingInit init;
  init.send(touching(dir));
  EXPECT_EQ(init.wait_exit(), 0);
  EXPECT_TRUE(exists(dir.file("started")));
}

TEST(InitAwait, TheMessageSaysWhatRunsWhereAndWithWhat) {
  TempDir dir;
  int out[2], err[2], in[2], extra[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(extra, O_CLOEXEC), 0);
  ASSERT_EQ(write(in[1], "from-stdin\n", 11), 11);
  close(in[1]);
  ASSERT_EQ(write(extra[1], "inherited\n", 10), 10);
  close(extra[1]);

  AwaitingInit init;
  supervisor::PayloadMessage message;
  // /dev/fd/N rather than sh's <&N: dash takes only one-digit fds there.
  message.argv = {"sh", "-c",
                  "pwd; echo $ONLY; env | grep -c . ; ulimit -Sn; cat; cat /dev/fd/" +
                      std::to_string(extra[0]) + "; echo to-err >&2; exit 5"};
  message.environment = {"ONLY=this", "PATH=/usr/bin:/bin"};
  message.workdir = dir.path();
  message.rlimits = {{supervisor::Resource::nofile, 40, 50}};
  message.stdio = {in[0], out[1], err[1]};
  message.inherit_fds = {extra[0]};
  init.send(message);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  close(extra[0]);
  EXPECT_EQ(init.wait_exit(), 5);
  // sh adds PWD (and may add SHLVL/_): at most these, and nothing of this test's environment.
  const auto output = read_to_eof(out[0]);
  EXPECT_EQ(output.rfind(dir.path() + "\nthis\n", 0), 0u) << output;
  EXPECT_NE(output.find("\n40\nfrom-stdin\ninherited\n"), std::string::npos) << output;
  const auto variables = std::stoi(output.substr(dir.path().size() + 6));
  EXPECT_LE(variables, 5) << output;
  EXPECT_EQ(read_to_eof(err[0]), "to-err\n");
  EXPECT_EQ(init.report().rfind("{\"exit_code\":5,", 0), 0u);
  close(out[0]);
  close(err[0]);
}

TEST(InitAwait, NothingOutlivesItsHost) {
  AwaitingInit init;
  supervisor::PayloadMessage message;
  // The number is assembled inside, so only the sleeps themselves match.
  message.argv = {"sh", "-c", "n=66.21; setsid sleep ${n}43 & exec sleep ${n}43"};
  message.environment = {"PATH=/usr/bin:/bin"};
  init.send(message);
  const auto until = Clock::now() + 10s;
  while (processes_with_cmdline("sleep 66.2143").size() < 2 && Clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(processes_with_cmdline("sleep 66.2143").size(), 2u);

  const auto closed = Clock::now();
  init.close_host();  // as when the host process dies
  EXPECT_EQ(init.wait_exit(), 128 + SIGKILL);
  EXPECT_LT(Clock::now() - closed, 2s) << "at once, without a grace";
  EXPECT_TRUE(processes_with_cmdline("sleep 66.2143").empty());
  EXPECT_NE(init.report().find("\"terminated\":true"), std::string::npos);
}

// A pool's sandboxes: the report comes as usual, but init stays (holding the namespaces) until the
// host closes its socket, so the teardown runs when the pool destroys the sandbox.
TEST(InitAwait, HeldAfterItsReportUntilTheHostLeaves) {
  AwaitingInit init({"--hold-after-report"});
  supervisor::PayloadMessage message;
  message.argv = {"/bin/sh", "-c", "exit 3"};
  message.environment = {"PATH=/usr/bin:/bin"};
  init.send(message);
  const std::string line = read_line(init.report_fd(), 10s);
  EXPECT_EQ(line.rfind("{\"exit_code\":3,", 0), 0u) << line;
  // Without the hold init would be gone within a millisecond of its report.
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(process_alive(init.pid())) << "init exited after its report";
  int status = 0;
  EXPECT_EQ(waitpid(init.pid(), &status, WNOHANG), 0);

  init.close_host();
  EXPECT_EQ(init.wait_exit(), 3) << "init mirrors the payload's exit once the host has left";
}

TEST(InitAwait, AHeldInitLeavesOnSigterm) {
  AwaitingInit init({"--hold-after-report"});
  supervisor::PayloadMessage message;
  message.argv = {"/bin/true"};
  init.send(message);
  EXPECT_EQ(read_line(init.report_fd(), 10s).rfind("{\"exit_code\":0,", 0), 0u);
  ASSERT_EQ(kill(init.pid(), SIGTERM), 0);
  EXPECT_EQ(init.wait_exit(), 0);
}

TEST(InitAwait, HoldingIsOnlyForAwaitMode) {
  const auto outcome =
      run_process({bin_path("rlm-sandbox-init"), "--hold-after-report", "--", "true"});
  EXPECT_EQ(outcome.exit_code, init_protocol::kInitFailureExit);
  EXPECT_NE(outcome.err.find("--hold-after-report needs --await-payload"), std::string::npos)
      << outcome.err;
}

TEST(InitAwait, TheCommandLineLeavesThePayloadToTheMessage) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--", "true"}, {"--chdir", "/tmp"}, {"--rlimit", "core=0"}}) {
    AwaitingInit init(args);
    EXPECT_EQ(init.wait_exit(), init_protocol::kInitFailureExit);
  }
}

}  // namespace
}  // namespace rlm::test
