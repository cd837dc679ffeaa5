// SelfReadingScope (sysutil/include/rlm_sys/self_readings.hpp): within a scope, the thread's reads
// of the mount table share one reading; outside it, and on other threads, every read is fresh.
// Each test changes the mount table in a mount namespace of a forked child's own, so the host's
// table is never touched; what a reading "saw" is whether it lists a tmpfs mounted on a scratch
// directory.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "rlm_sys/self_readings.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using sys::SelfReadingScope;

// `body` in a forked child; its return value is the child's exit code (-1: no child).
template <typename Body>
int in_child(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

class SelfReadings : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make a mount namespace";
    std::filesystem::create_directories(point_);
  }
  // Runs `body` in a forked child with a private mount namespace; its exit code (80-81: none).
  template <typename Body>
  int in_own_mount_table(Body body) {
    return in_child([&] {
      if (unshare(CLONE_NEWNS) != 0) return 80;
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 81;
      return body();
    });
  }
  bool mount_now() const { return mount("tmpfs", point_.c_str(), "tmpfs", 0, "size=64k") == 0; }
  // Whether a reading of the mount table lists the scratch tmpfs (false when there is none).
  bool shows_mount(const std::optional<std::string>& table) const {
    return table && table->find(" " + point_ + " ") != std::string::npos;
  }

  TempDir dir_;
  const std::string point_ = dir_.file("point");
};

TEST_F(SelfReadings, WithoutAScopeEveryReadIsFresh) {
  // The control for the tests below: a mount shows in the next reading.
  const int code = in_own_mount_table([&] {
    if (shows_mount(sys::self_mountinfo())) return 1;
    if (!mount_now()) return 2;
    return shows_mount(sys::self_mountinfo()) ? 0 : 3;
  });
  EXPECT_EQ(code, 0);
}

TEST_F(SelfReadings, AScopeReadsOnceAndItsEndReadsAfresh) {
  const int code = in_own_mount_table([&] {
    std::optional<std::string> first, during;
    {
      const SelfReadingScope scope;
      first = sys::self_mountinfo();
      if (!first || shows_mount(first)) return 1;
      if (!mount_now()) return 2;
      during = sys::self_mountinfo();
    }
    if (during != first) return 3;
    return shows_mount(sys::self_mountinfo()) ? 0 : 4;
  });
  // 3: the scope read again; 4: its reading outlived it.
  EXPECT_EQ(code, 0);
}

TEST_F(SelfReadings, AnInnerScopeSharesTheOuterOnesReading) {
  const int code = in_own_mount_table([&] {
    const SelfReadingScope outer;
    const auto first = sys::self_mountinfo();
    if (!mount_now()) return 1;
    {
      const SelfReadingScope inner;
      if (sys::self_mountinfo() != first) return 2;
    }
    // The inner scope's end did not end the outer's reading.
    return sys::self_mountinfo() == first ? 0 : 3;
  });
  EXPECT_EQ(code, 0);
}

TEST_F(SelfReadings, AnotherThreadReadsForItself) {
  const int code = in_own_mount_table([&] {
    const SelfReadingScope scope;
    if (shows_mount(sys::self_mountinfo())) return 1;
    if (!mount_now()) return 2;
    bool other_saw = false;
    std::thread other([&] { other_saw = shows_mount(sys::self_mountinfo()); });
    other.join();
    return other_saw ? 0 : 3;
  });
  EXPECT_EQ(code, 0);
}

TEST_F(SelfReadings, TheCgroupFileIsTheKernelsText) {
  // What the scope keeps for /proc/self/cgroup is what a plain read gives.
  const SelfReadingScope scope;
  const auto text = sys::self_cgroup();
  ASSERT_TRUE(text.has_value());
  std::ifstream file("/proc/self/cgroup");
  const std::string direct{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  EXPECT_FALSE(direct.empty());
  EXPECT_EQ(*text, direct);
}

}  // namespace
}  // namespace rlm::test
