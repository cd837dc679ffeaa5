// The Landlock module (runtime/landlock/) against the running kernel: each test confines a forked
// child with a ruleset and attempts what the ruleset must deny, next to a control the same child
// (or an unconfined twin) must be allowed, so no test passes because the operation never worked.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "landlock/landlock.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::landlock {
namespace {

namespace fs = std::filesystem;

#define REQUIRE_LANDLOCK(abi)                                                             \
  do {                                                                                    \
    if (abi_version() < (abi))                                                            \
      GTEST_SKIP() << "the kernel's Landlock ABI is " << abi_version() << ", this needs " \
                   << (abi);                                                              \
  } while (0)

// Runs `body` in a forked child confined by `ruleset` (no_new_privs first); the child's exit
// status is body's return value (0 = the attempt succeeded, else its errno). `child_rules` runs
// in the child before the restriction. 200 = the restriction itself failed.
int confined(const Ruleset& ruleset, const std::function<int()>& body,
             const std::function<int(int)>& child_rules = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(201);
    if (child_rules && child_rules(ruleset.fd()) != 0) _exit(202);
    if (apply_restrict_self(ruleset.fd()) != 0) _exit(200);
    _exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int open_errno(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

class LandlockModule : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rlm-landlock-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    fs::create_directories(root_ / "allowed" / "sub");
    fs::create_directories(root_ / "writable");
    std::ofstream(root_ / "allowed" / "sub" / "file") << "inside";
    std::ofstream(root_ / "secret") << "outside";
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  std::string path(const std::string& relative) const { return (root_ / relative).string(); }

  fs::path root_;
};

TEST(LandlockAbi, TheKernelReportsAVersionAndEnforcedFollowsIt) {
  const int abi = abi_version();
  EXPECT_GE(abi, 0);
  EXPECT_EQ(abi_version(), abi);  // cached, stable
  const RulesetOptions all{true, true, true, true};
  const RulesetOptions got = enforced(all);
  EXPECT_EQ(got.filesystem, abi >= 1);
  EXPECT_EQ(got.deny_tcp, abi >= kAbiTcp);
  EXPECT_EQ(got.scope_abstract_unix, abi >= kAbiScoped);
  EXPECT_EQ(got.scope_signals, abi >= kAbiScoped);
  if (abi == 0) {
    EXPECT_THROW(prepare_ruleset({}), Error);
  }
}

TEST_F(LandlockModule, AReadBeneathAnAllowedDirectoryWorksAndOneOutsideIsDenied) {
  REQUIRE_LANDLOCK(1);
  Ruleset ruleset = prepare_ruleset({});
  allow_beneath(ruleset, path("allowed"), read);
  const std::string inside = path("allowed/sub/file"), outside = path("secret");
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(inside, O_RDONLY); }), 0);
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(outside, O_RDONLY); }), EACCES);
  // Unconfined, the same open works: the denial is the ruleset's.
  EXPECT_EQ(open_errno(outside, O_RDONLY), 0);
}

TEST_F(LandlockModule, ReadOnlyAccessRefusesWritesAndCreationWhileWriteAccessAllowsThem) {
  REQUIRE_LANDLOCK(1);
  Ruleset ruleset = prepare_ruleset({});
  allow_beneath(ruleset, path("allowed"), read);
  allow_beneath(ruleset, path("writable"), read | write);
  const std::string existing = path("allowed/sub/file");
  const std::string created_ro = path("allowed/new"), created_rw = path("writable/new");
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(existing, O_WRONLY); }), EACCES);
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(created_ro, O_WRONLY | O_CREAT); }), EACCES);
  EXPECT_FALSE(fs::exists(created_ro));
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(created_rw, O_WRONLY | O_CREAT); }), 0);
  EXPECT_TRUE(fs::exists(created_rw));
  // Renaming a file out of the writable tree into a read-only one is refused too.
  const std::string moved = path("allowed/moved");
  EXPECT_NE(
      confined(ruleset, [&] { return rename(created_rw.c_str(), moved.c_str()) ? errno : 0; }), 0);
  EXPECT_FALSE(fs::exists(moved));
}

TEST_F(LandlockModule, ARuleOnAFileGetsOnlyFileRightsAndCoversThatFileAlone) {
  REQUIRE_LANDLOCK(1);
  Ruleset ruleset = prepare_ruleset({});
  // read|write on a file would be EINVAL if directory rights reached the kernel.
  EXPECT_NO_THROW(allow_beneath(ruleset, path("allowed/sub/file"), read | write | execute));
  const std::string file = path("allowed/sub/file");
  const std::string sibling = path("allowed/sub/other");
  std::ofstream(sibling) << "x";
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(file, O_RDWR); }), 0);
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(sibling, O_RDONLY); }), EACCES);
}

TEST_F(LandlockModule, ASymbolicLinkIsRefusedNeverFollowed) {
  REQUIRE_LANDLOCK(1);
  Ruleset ruleset = prepare_ruleset({});
  fs::create_symlink(root_ / "secret", root_ / "link");
  EXPECT_THROW(allow_beneath(ruleset, path("link"), read), Error);
  EXPECT_THROW(allow_beneath(ruleset, path("missing"), read), Error);
}

TEST_F(LandlockModule, ARuleAddedInTheChildBeforeRestrictingGrantsThatPath) {
  REQUIRE_LANDLOCK(1);
  Ruleset ruleset = prepare_ruleset({});
  const std::string dir = path("allowed"), file = path("allowed/sub/file");
  const unsigned long long bits = access_bits(read);
  // Without the child's rule the read is denied; with it, allowed.
  EXPECT_EQ(confined(ruleset, [&] { return open_errno(file, O_RDONLY); }), EACCES);
  EXPECT_EQ(confined(
                ruleset, [&] { return open_errno(file, O_RDONLY); },
                [&](int fd) { return apply_allow_beneath(fd, dir.c_str(), bits); }),
            0);
  // A missing path is an error the child sees (-ENOENT), not a crash.
  EXPECT_EQ(apply_allow_beneath(ruleset.fd(), path("missing").c_str(), bits), -ENOENT);
}

// A TCP listener on 127.0.0.1 (port chosen by the kernel), owned by the test.
struct Listener {
  int fd = -1;
  sockaddr_in address{};
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        listen(fd, 8) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      ADD_FAILURE() << "listener: " << std::strerror(errno);
  }
  ~Listener() { close(fd); }
  int connect_errno() const {
    const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (client < 0) return errno;
    const int result =
        connect(client, reinterpret_cast<const sockaddr*>(&address), sizeof address) ? errno : 0;
    close(client);
    return result;
  }
};

TEST(LandlockNet, TcpConnectAndBindAreDeniedWhenHandled) {
  REQUIRE_LANDLOCK(kAbiTcp);
  Listener listener;
  Ruleset deny = prepare_ruleset({.filesystem = false, .deny_tcp = true});
  EXPECT_EQ(confined(deny, [&] { return listener.connect_errno(); }), EACCES);
  EXPECT_EQ(confined(deny,
                     [] {
                       const int s = socket(AF_INET, SOCK_STREAM, 0);
                       sockaddr_in any{};
                       any.sin_family = AF_INET;
                       any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                       any.sin_port = htons(0);
                       return bind(s, reinterpret_cast<sockaddr*>(&any), sizeof any) ? errno : 0;
                     }),
            EACCES);
  // Control: a ruleset that does not handle TCP lets the same child connect.
  Ruleset filesystem_only = prepare_ruleset({.filesystem = true});
  allow_beneath(filesystem_only, "/", read);
  EXPECT_EQ(confined(filesystem_only, [&] { return listener.connect_errno(); }), 0);
}

// An abstract unix listener named after this process, owned by the test.
struct AbstractListener {
  int fd = -1;
  sockaddr_un address{};
  socklen_t length = 0;
  AbstractListener() {
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    address.sun_family = AF_UNIX;
    const std::string name = "rlm-landlock-test/" + std::to_string(getpid());
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd, 8) != 0)
      ADD_FAILURE() << "abstract listener: " << std::strerror(errno);
  }
  ~AbstractListener() { close(fd); }
  int connect_errno() const {
    const int client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int result =
        connect(client, reinterpret_cast<const sockaddr*>(&address), length) ? errno : 0;
    close(client);
    return result;
  }
};

TEST(LandlockScope, AnAbstractUnixSocketOutsideTheDomainCannotBeReached) {
  REQUIRE_LANDLOCK(kAbiScoped);
  AbstractListener listener;
  Ruleset scoped = prepare_ruleset({.filesystem = false, .scope_abstract_unix = true});
  EXPECT_EQ(confined(scoped, [&] { return listener.connect_errno(); }), EPERM);
  Ruleset signals_only = prepare_ruleset({.filesystem = false, .scope_signals = true});
  EXPECT_EQ(confined(signals_only, [&] { return listener.connect_errno(); }), 0);
}

TEST(LandlockScope, AProcessOutsideTheDomainCannotBeSignalled) {
  REQUIRE_LANDLOCK(kAbiScoped);
  const pid_t outside = fork();
  if (outside == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(outside, 0);
  Ruleset scoped = prepare_ruleset({.filesystem = false, .scope_signals = true});
  EXPECT_EQ(confined(scoped, [&] { return kill(outside, SIGKILL) ? errno : 0; }), EPERM);
  EXPECT_EQ(kill(outside, 0), 0) << "the process outside must still live";
  Ruleset unix_only = prepare_ruleset({.filesystem = false, .scope_abstract_unix = true});
  EXPECT_EQ(confined(unix_only, [&] { return kill(outside, 0) ? errno : 0; }), 0);
  kill(outside, SIGKILL);
  waitpid(outside, nullptr, 0);
}

}  // namespace
}  // namespace rlm::landlock
