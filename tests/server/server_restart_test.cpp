// A server killed with SIGKILL in the middle of a run leaves nothing: the run's processes die with
// it, its cgroups are collected by the next server, the stale socket is replaced, and the next run
// works. And a socket path that is not a stale socket is never taken over.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../cli/cli_test_util.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

// The cgroup directories (on the host) a process is in, below an "rlm-sandbox" parent.
std::vector<std::string> sandbox_groups_of(pid_t pid) {
  std::vector<std::string> groups;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':', line.find(':') + 1);
    const std::string controllers = line.substr(line.find(':') + 1, colon - line.find(':') - 1);
    const std::string path = line.substr(colon + 1);
    if (path.find("/rlm-sandbox/") == std::string::npos) continue;
    // v1: one hierarchy per controller list; v2: the unified one, beside v1 or alone.
    const std::vector<std::string> roots =
        controllers.empty() ? std::vector<std::string>{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
                            : std::vector<std::string>{"/sys/fs/cgroup/" + controllers};
    for (const auto& root : roots)
      if (std::filesystem::exists(root + path)) groups.push_back(root + path);
  }
  return groups;
}

TEST(ServerRestart, SigkillMidRunLeavesNothingAndTheNextServerServes) {
  TempDir dir;
  auto server =
      std::make_unique<ServerUnderTest>(dir, std::vector<std::string>{"--pool", "default=1"});
  ASSERT_TRUE(server->ready()) << server->log();

  const std::vector<std::string> payload = {"sleep", "61.25"};
  int out = -1;
  const pid_t client = spawn_cli(
      {"run", "--server", server->socket(), "--", "/bin/sh", "-c", "echo up; exec sleep 61.25"},
      out);
  ASSERT_GT(client, 0);
  char up[3] = {};
  ASSERT_EQ(read(out, up, 3), 3);
  std::vector<pid_t> sleepers;
  ASSERT_TRUE(eventually([&] { return !(sleepers = processes_running(payload)).empty(); }));
  std::vector<std::string> groups;
  for (pid_t pid : sleepers)
    for (auto& group : sandbox_groups_of(pid)) groups.push_back(group);

  if (std::filesystem::exists("/sys/fs/cgroup/memory/rlm-sandbox")) {
    EXPECT_FALSE(groups.empty()) << "the run's cgroups were not found";
  }

  server->kill_hard();
  EXPECT_TRUE(eventually([&] { return processes_running(payload).empty(); }))
      << "the run's payload outlived its server";
  int status = 0;
  ASSERT_EQ(waitpid(client, &status, 0), client);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 125)
      << "the client learns the server died";
  close(out);
  EXPECT_TRUE(std::filesystem::exists(dir.file("s.sock"))) << "a killed server leaves its socket";

  server = std::make_unique<ServerUnderTest>(dir, std::vector<std::string>{"--pool", "default=1"});
  ASSERT_TRUE(server->ready()) << "the stale socket was not replaced: " << server->log();
  auto next = cli({"run", "--server", server->socket(), "--", "/bin/echo", "again"});
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_EQ(next.out, "again\n");
  for (const auto& group : groups)
    EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(group); }))
        << group << " was left behind";
  // No mount of the old run is visible on the host.
  std::ifstream mounts("/proc/self/mountinfo");
  std::stringstream text;
  text << mounts.rdbuf();
  for (const auto& group : groups)
    EXPECT_EQ(text.str().find(std::filesystem::path(group).filename().string()), std::string::npos);
}

// The pools' fds: a server started under a low soft open-files limit raises it to the hard one,
// and says so when even that is short of what its pools may hold.
TEST(ServerLimits, TheOpenFilesLimitIsRaisedAndAShortOneIsSaid) {
  if (access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "no prlimit(1) (util-linux) here";
  const auto soft_limit_of = [](pid_t pid) {
    std::ifstream limits("/proc/" + std::to_string(pid) + "/limits");
    for (std::string line; std::getline(limits, line);)
      if (line.rfind("Max open files", 0) == 0) return std::stoull(line.substr(26));
    return 0ull;
  };
  {
    TempDir dir;
    ServerUnderTest server(dir, {"--pool", "default=2"},
                           {"/usr/bin/prlimit", "--nofile=256:8192", "--"});
    ASSERT_TRUE(server.ready()) << server.log();
    EXPECT_EQ(soft_limit_of(server.pid()), 8192u);
    EXPECT_EQ(server.log().find("open-files limit"), std::string::npos) << server.log();
  }
  {
    TempDir dir;
    ServerUnderTest server(dir, {"--pool", "default=16"},
                           {"/usr/bin/prlimit", "--nofile=256:512", "--"});
    ASSERT_TRUE(server.ready()) << server.log();
    EXPECT_EQ(soft_limit_of(server.pid()), 512u);
    EXPECT_NE(server.log().find("\"message\":\"the open-files limit (512) is below"),
              std::string::npos)
        << server.log();
  }
}

// The server's own umask reaches neither its socket nor its sandboxes. It once set the process's
// mask to 0777 for a moment while binding its socket, and a sandbox its pools built meanwhile took
// that mask: directories of the root filesystem without search permission, payload files nobody
// could read. Under a server whose umask is 0777 throughout, every sandbox would show it.
TEST(ServerUmask, TheServersUmaskReachesNeitherItsSocketNorItsSandboxes) {
  TempDir dir;
  ServerUnderTest server(dir, {"--pool", "default=2", "--socket-mode", "0600"},
                         {"/bin/sh", "-c", "umask 0777 && exec \"$@\"", "sh"});
  ASSERT_TRUE(server.ready()) << server.log();
  struct stat socket_status {};
  ASSERT_EQ(lstat(server.socket().c_str(), &socket_status), 0);
  EXPECT_EQ(socket_status.st_mode & 07777, 0600u) << "--socket-mode is the socket's mode exactly";
  // Pooled sandboxes (built before and after the socket) and one built for the run.
  for (int i = 0; i < 3; ++i) {
    auto run = cli({"run", "--server", server.socket(), "--", "/bin/sh", "-c",
                    "umask; stat -c %a /etc /tmp; cd /tmp && mkdir d && echo x > f && "
                    "stat -c %a d f && cat f"});
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out, "0022\n755\n1777\n755\n644\nx\n") << "run " << i;
  }
}

TEST(ServerRestart, LiveServerSocketIsNotTakenOver) {
  TempDir dir;
  ServerUnderTest first(dir, {"--pool", "default=0"});
  ASSERT_TRUE(first.ready()) << first.log();
  auto second = cli({"serve", "--socket", first.socket(), "--pool", "default=0"});
  EXPECT_EQ(second.exit_code, 125);
  EXPECT_NE(second.err.find("another server already listens"), std::string::npos) << second.err;
  EXPECT_NO_THROW(ServerConnection(first.socket()).hello());
}

TEST(ServerRestart, FileThatIsNotASocketIsNeverReplaced) {
  TempDir dir;
  dir.write("s.sock", "precious");
  auto outcome = cli({"serve", "--socket", dir.file("s.sock"), "--pool", "default=0"});
  EXPECT_EQ(outcome.exit_code, 125);
  EXPECT_NE(outcome.err.find("is not a socket"), std::string::npos) << outcome.err;
  EXPECT_EQ(dir.read("s.sock"), "precious");
}

TEST(ServerRestart, CleanStopRemovesTheSocketFile) {
  TempDir dir;
  ServerUnderTest server(dir, {"--pool", "default=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_FALSE(std::filesystem::exists(dir.file("s.sock")));
}

}  // namespace
}  // namespace rlm::test

namespace rlm::test {
namespace {

// systemd's socket activation (LISTEN_FDS): the server takes the socket it is given, and leaves
// the socket file to whoever made it.
TEST(ServerSystemd, SocketActivationServesOnThePassedSocket) {
  const char* activate = "/usr/bin/systemd-socket-activate";
  if (access(activate, X_OK) != 0) GTEST_SKIP() << "no " << activate;
  TempDir dir;
  const std::string socket = dir.file("activated.sock");
  const pid_t activator =
      spawn({activate, "-l", socket, bin_path("rlm-sandbox"), "serve", "--pool", "default=0"});
  ASSERT_GT(activator, 0);
  bool served = false;
  std::string err;
  for (int i = 0; i < 100 && !served; ++i) {
    auto outcome = cli({"run", "--server", socket, "--", "/bin/echo", "activated"});
    served = outcome.exit_code == 0 && outcome.out == "activated\n";
    err = outcome.err;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served) << err;
  kill(activator, SIGTERM);
  int status = 0;
  waitpid(activator, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the server stops cleanly";
}

}  // namespace
}  // namespace rlm::test
