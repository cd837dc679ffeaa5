// SandboxUid: a host uid of its own per live sandbox, held by a flock on a file in a root-only
// directory. Real locks; each test uses a small range of its own (outside the default one), so that
// no other runtime on the machine competes for its uids.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
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
#include <string>

#include "host/sandbox_uid.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::host {
namespace {

UidRange private_range(unsigned test_number, unsigned size) {
  const uid_t first = 0x70200000u + static_cast<uid_t>(getpid() % 20000) * 64u + test_number * 8u;
  return {first, first + size - 1};
}

std::string error_of(const std::string& text) {
  try {
    parse_uid_range(text, "RLM_SANDBOX_UID_RANGE");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(SandboxUidSlot, TheFirstFreeUidIsTakenAndFreedWithItsHolder) {
  const auto range = private_range(0, 3);
  auto a = SandboxUid::acquire(range);
  auto b = SandboxUid::acquire(range);
  EXPECT_EQ(a.uid(), range.first);
  EXPECT_EQ(b.uid(), range.first + 1);
  a.release();
  auto c = SandboxUid::acquire(range);  // the first free one again: a's
  EXPECT_EQ(c.uid(), range.first);
  auto d = SandboxUid::acquire(range);
  EXPECT_EQ(d.uid(), range.first + 2);
}

TEST(SandboxUidSlot, AFullRangeIsAnErrorThatSaysHowToWidenIt) {
  const auto range = private_range(1, 2);
  auto a = SandboxUid::acquire(range);
  auto b = SandboxUid::acquire(range);
  try {
    SandboxUid::acquire(range);
    FAIL() << "a third uid from a range of two";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("RLM_SANDBOX_UID_RANGE"), std::string::npos) << message;
    EXPECT_NE(message.find(range.describe()), std::string::npos) << message;
  }
}

TEST(SandboxUidSlot, AnotherProcessNeverGetsAHeldUidAndItsDeathFreesIt) {
  const auto range = private_range(2, 4);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    close(ready[0]);
    auto slot = SandboxUid::acquire(range);
    const char taken = slot.uid() == range.first ? 1 : 0;
    if (write(ready[1], &taken, 1) != 1) _exit(1);
    pause();  // until SIGKILL: the kernel must free the uid, nobody else does
    _exit(0);
  }
  close(ready[1]);
  char taken = 0;
  ASSERT_EQ(read(ready[0], &taken, 1), 1);
  close(ready[0]);
  EXPECT_EQ(taken, 1);
  {
    auto mine = SandboxUid::acquire(range);
    EXPECT_EQ(mine.uid(), range.first + 1);  // the holder's uid is skipped
  }
  kill(holder, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(holder, &status, 0), holder);
  auto after = SandboxUid::acquire(range);
  EXPECT_EQ(after.uid(), range.first);
}

// Binds the abstract name that held a slot before (the attack of issue 24: any local user could
// bind them all) and tries to lock the slot's file; 0 when the child could do neither.
int hold_as_nobody(uid_t uid, int ready_fd, int go_fd, int parent_ends[2]) {
  const pid_t child = fork();
  if (child != 0) return child;
  close(parent_ends[0]);  // else its own copy of the go pipe's write end keeps it waiting
  close(parent_ends[1]);
  if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
      setresuid(65534, 65534, 65534) != 0)
    _exit(100);
  char result = 0;
  const int sock = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = "rlm-sandbox/uid/" + std::to_string(uid);
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  (void)bind(sock, reinterpret_cast<sockaddr*>(&address),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size()));
  const std::string file = std::string(kDefaultUidLockDir) + "/" + std::to_string(uid);
  const int fd = open(file.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) result = 1;  // it holds the slot
  if (write(ready_fd, &result, 1) != 1) _exit(101);
  char go;
  (void)read(go_fd, &go, 1);  // holds whatever it got until the parent has looked
  _exit(0);
}

TEST(SandboxUidSlot, AnotherLocalUserCanNeitherHoldNorSteerASlot) {
  ASSERT_EQ(geteuid(), 0u) << "slots are a root runtime's";
  unsetenv(kUidLockDirVariable);
  const auto range = private_range(4, 3);
  { SandboxUid::acquire(range); }  // the lock directory exists, as on any host that ran a sandbox
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  int parent_ends[2] = {ready[0], go[1]};
  const pid_t nobody = hold_as_nobody(range.first, ready[1], go[0], parent_ends);
  ASSERT_GT(nobody, 0);
  close(ready[1]);
  close(go[0]);
  char held = 1;
  ASSERT_EQ(read(ready[0], &held, 1), 1);
  EXPECT_EQ(held, 0) << "uid 65534 locked a slot's file";
  // Whatever it bound, the first slot is still the runtime's to take.
  auto slot = SandboxUid::acquire(range);
  EXPECT_EQ(slot.uid(), range.first);
  close(go[1]);
  close(ready[0]);
  int status = 0;
  ASSERT_EQ(waitpid(nobody, &status, 0), nobody);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  struct stat dir {};
  ASSERT_EQ(stat(kDefaultUidLockDir, &dir), 0);
  EXPECT_EQ(dir.st_uid, 0u);
  EXPECT_EQ(dir.st_mode & 077, 0u);
}

TEST(SandboxUidSlot, ALockDirectoryOthersMayEnterOrThatIsALinkIsRefused) {
  const std::string base = "/tmp/rlm-uid-locks-" + std::to_string(getpid());
  std::filesystem::remove_all(base);
  ASSERT_EQ(mkdir(base.c_str(), 0700), 0);
  const auto range = private_range(5, 2);
  const auto refused = [&](const std::string& dir) {
    setenv(kUidLockDirVariable, dir.c_str(), 1);
    try {
      SandboxUid::acquire(range);
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(kUidLockDirVariable), std::string::npos) << message;
      EXPECT_NE(message.find(dir), std::string::npos) << message;
      return true;
    }
    return false;
  };
  const std::string open_to_all = base + "/open";
  ASSERT_EQ(mkdir(open_to_all.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_to_all.c_str(), 0755), 0);
  EXPECT_TRUE(refused(open_to_all));
  const std::string others = base + "/others";
  ASSERT_EQ(mkdir(others.c_str(), 0700), 0);
  ASSERT_EQ(chown(others.c_str(), 65534, 65534), 0);
  EXPECT_TRUE(refused(others));
  const std::string link = base + "/link";
  const std::string good = base + "/good";
  ASSERT_EQ(mkdir(good.c_str(), 0700), 0);
  ASSERT_EQ(symlink(good.c_str(), link.c_str()), 0);
  EXPECT_TRUE(refused(link));
  EXPECT_FALSE(refused(good));  // the control: a directory of its own is used
  EXPECT_TRUE(std::filesystem::exists(good + "/" + std::to_string(range.first)));
  const std::string made = base + "/made";  // missing: made 0700
  EXPECT_FALSE(refused(made));
  struct stat st {};
  ASSERT_EQ(stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  unsetenv(kUidLockDirVariable);
  std::filesystem::remove_all(base);
}

TEST(SandboxUidSlot, TheRangeComesFromTheEnvironmentAndDefaultsToAnUnusedBand) {
  unsetenv(kUidRangeVariable);
  const auto fallback = sandbox_uid_range();
  EXPECT_EQ(fallback.first, 1879048192u);
  EXPECT_EQ(fallback.last, 1879048192u + 65535u);
  setenv(kUidRangeVariable, "200000-200099", 1);
  const auto set = sandbox_uid_range();
  EXPECT_EQ(set.first, 200000u);
  EXPECT_EQ(set.last, 200099u);
  setenv(kUidRangeVariable, "200000", 1);
  EXPECT_THROW(sandbox_uid_range(), Error);
  unsetenv(kUidRangeVariable);
}

TEST(SandboxUidSlot, RangesWithIdsThatMustNeverBeHandedOutAreRefused) {
  EXPECT_EQ(error_of("100000-100010"), "");
  EXPECT_EQ(error_of("5-5"), "");
  for (const char* bad :
       {"0-10", "65000-70000", "65535-65535", "4294967200-4294967295", "10-5", "", "-", "a-b", "1-",
        "-1", "1 - 2", "+1-2", "1-2-3", "99999999999999999999-1"}) {
    const auto message = error_of(bad);
    EXPECT_NE(message, "") << bad;
    EXPECT_NE(message.find("RLM_SANDBOX_UID_RANGE"), std::string::npos) << message;
  }
  EXPECT_NE(error_of("65534-65534").find("nobody"), std::string::npos);
  EXPECT_NE(error_of("0-0").find("root"), std::string::npos);
}

}  // namespace
}  // namespace rlm::host
