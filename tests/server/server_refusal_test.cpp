// What the server refuses, and how the refusal reaches a user: a policy it does not offer, a flag
// that loosens the policy, a bind outside what it permits, a peer uid it does not allow. Each is
// exit 125 with the reason from the CLI, and nothing runs anywhere else.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grp.h>

#include <cstring>

#include "../cli/cli_test_util.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/listener.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

// `rlm-sandbox ARGS...` as uid 65534: how it exited and what it said on stderr.
ProcessOutcome cli_as_nobody(std::vector<std::string> args) {
  int err[2];
  ProcessOutcome outcome;
  if (pipe2(err, O_CLOEXEC) != 0) return outcome;
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  outcome.pid = spawn(std::move(args), -1, err[1], /*as_nobody=*/true);
  close(err[1]);
  char buffer[4096];
  for (ssize_t n; (n = read(err[0], buffer, sizeof buffer)) > 0;) outcome.err.append(buffer, n);
  close(err[0]);
  int status = 0;
  waitpid(outcome.pid, &status, 0);
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  EXPECT_NE(outcome.exit_code, 126) << "cannot become uid 65534";
  EXPECT_NE(outcome.exit_code, 127) << "uid 65534 cannot execute " << bin_path("rlm-sandbox");
  return outcome;
}

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
  const auto marker = dir_.file("ran-as-nobody");
  const auto outcome = cli_as_nobody(
      {"run", "--server", server_->socket(), "--", "/bin/sh", "-c", "echo > " + marker});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("uid 65534"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("not allowed"), std::string::npos) << outcome.err;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(ServerAllowList, AllowedUidIsServed) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir,
                         {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  const auto outcome =
      cli_as_nobody({"run", "--server", server.socket(), "--", "/bin/sh", "-c", "exit 7"});
  EXPECT_EQ(outcome.exit_code, 7) << outcome.err << server.log();
}

// The README's recipe: --allow-uid alone (the socket keeps its default 0660, root's). Before, the
// socket file locked the allowed uid out and the client said "no server at ...". The allowed uid
// and gid are granted the socket file through an ACL; a uid that is neither is told "permission
// denied on the socket" with the flag that fixes it.
TEST(ServerAllowList, AllowedUidsAndGidsReachTheSocketWithoutASocketMode) {
  for (const char* flag : {"--allow-uid", "--allow-gid"}) {
    TempDir dir;
    chmod(dir.path().c_str(), 0755);
    ServerUnderTest server(dir, {"--pool", "default=0", flag, "65534"});
    ASSERT_TRUE(server.ready()) << server.log();
    struct stat status {};
    ASSERT_EQ(stat(server.socket().c_str(), &status), 0);
    EXPECT_EQ(status.st_mode & 0007, 0u) << "others stay shut out by the mode";
    const auto outcome =
        cli_as_nobody({"run", "--server", server.socket(), "--", "/bin/sh", "-c", "exit 7"});
    EXPECT_EQ(outcome.exit_code, 7) << flag << ": " << outcome.err << server.log();
  }
}

// What the server changes on its socket file (mode, ACL) goes through an fd of the file it made,
// never the name: in a directory another user writes, the name may be swapped for a symlink to
// any file between bind and chmod (an attack won that race: root's 0600 file got the allowed
// uid's ACL). The check that fd passes: a socket, ours, one link, not a symlink.
TEST(ServerSocketFile, OnlyASocketFileOfOurOwnIsTakenForTheServers) {
  TempDir dir;
  const auto bound = [&](const std::string& name) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = dir.file(name);
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
    close(fd);
    return path;
  };
  const std::string own = bound("own.sock");
  EXPECT_TRUE(server::open_own_socket_file(own)) << "the socket this process made";

  dir.write("secret", "root's own");
  ASSERT_EQ(symlink(dir.file("secret").c_str(), dir.file("link.sock").c_str()), 0);
  EXPECT_FALSE(server::open_own_socket_file(dir.file("link.sock"))) << "a symlink to a file";
  ASSERT_EQ(symlink(own.c_str(), dir.file("link-to-socket.sock").c_str()), 0);
  EXPECT_FALSE(server::open_own_socket_file(dir.file("link-to-socket.sock")))
      << "a symlink, even to a socket";
  EXPECT_FALSE(server::open_own_socket_file(dir.file("secret"))) << "not a socket";
  const std::string theirs = bound("theirs.sock");
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(server::open_own_socket_file(theirs)) << "another user's socket";
  ASSERT_EQ(link(own.c_str(), dir.file("second-name.sock").c_str()), 0);
  EXPECT_FALSE(server::open_own_socket_file(own)) << "a socket with a second name";
}

TEST(ServerAllowList, AUidTheSocketShutsOutIsToldPermissionDeniedAndTheFix) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir, {"--pool", "default=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  const auto outcome = cli_as_nobody({"run", "--server", server.socket(), "--", "/bin/true"});
  EXPECT_EQ(outcome.exit_code, 125);
  EXPECT_NE(outcome.err.find("permission denied on the socket " + server.socket()),
            std::string::npos)
      << outcome.err;
  EXPECT_NE(outcome.err.find("--allow-uid 65534"), std::string::npos) << outcome.err;
}

}  // namespace
}  // namespace rlm::test
