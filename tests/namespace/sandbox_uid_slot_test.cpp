// SandboxUid: a host uid of its own per live sandbox, held by an abstract unix socket. Real
// sockets in this process's network namespace; each test uses a small range of its own (outside
// the default one), so that no other runtime on the machine competes for its uids.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/sandbox_uid.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::common {
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
}  // namespace rlm::common
