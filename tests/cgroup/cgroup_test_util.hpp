// Helpers for the cgroup tests: children that wait to be attached before they act, access to a
// group's directories, and what this host offers.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/magic.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cgroup/cgroup.hpp"
#include "cgroup/group.hpp"
#include "support/lane.hpp"

namespace rlm::test {

// A forked child that blocks until release(), then runs `body` and _exits with its return value.
// `body` runs in a forked copy of a possibly multithreaded process: async-signal-safe calls only
// (mmap, fork, pause, write...). Killed and reaped on destruction if still around.
class WaitingChild {
 public:
  explicit WaitingChild(const std::function<int()>& body) {
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 1) ::_exit(120);
      ::_exit(body());
    }
    ::close(go[0]);
    go_ = go[1];
  }
  ~WaitingChild() {
    if (go_ >= 0) ::close(go_);
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  WaitingChild(const WaitingChild&) = delete;
  WaitingChild& operator=(const WaitingChild&) = delete;

  pid_t pid() const { return pid_; }
  void release() {
    ASSERT_EQ(::write(go_, "x", 1), 1);
    ::close(go_);
    go_ = -1;
  }
  // The wait status. A child still running after `timeout` fails the test (and is killed), so a
  // broken kill path shows as a failure, not a hang.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0) {
        ADD_FAILURE() << "waitpid " << pid_ << ": " << errno;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ADD_FAILURE() << "child " << pid_ << " still running after " << timeout.count() << " ms";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        status = -1;
        break;
      }
      ::usleep(1000);
    }
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int go_ = -1;
  bool reaped_ = false;
};

// A WaitingChild body that never ends by itself.
inline int sleep_forever() {
  for (;;) ::pause();
}

inline const std::vector<std::string>& dirs_of(const cgroup::RunCgroup& group) {
  return dynamic_cast<const cgroup::GroupDirs&>(group).dirs();
}

inline bool dir_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

inline bool is_cgroup2_host() {
  struct statfs fs {};
  return ::statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC;
}

// Creates a group or fails the test: as root, this host must give us one.
#define RLM_MAKE_GROUP(var, limits)                             \
  auto var##_made = ::rlm::cgroup::RunCgroup::create((limits)); \
  auto var = std::move(var##_made.group);                       \
  ASSERT_NE(var, nullptr) << "no cgroup on this host: " << var##_made.problem

// Skips a test that needs root (creating groups under the host's hierarchies).
#define RLM_REQUIRE_ROOT()                                           \
  if (::geteuid() != 0)                                              \
  GTEST_SKIP() << "needs root: cgroup groups are created under the " \
                  "host's hierarchies (run the tests as root)"

// Skips a test that needs to create groups where this user cannot: root always can (on v1 the
// groups go under the host's hierarchies); an ordinary user only in a delegated cgroup v2
// subtree (lane user-delegated-cgroup-v2, see tests/lanes/run-lane).
#define RLM_REQUIRE_CGROUP_ACCESS()                                                        \
  if (::geteuid() != 0 && !::rlm::test::lane_has_cgroups())                                \
  GTEST_SKIP() << "this user can create no cgroup here (lane " << ::rlm::test::test_lane() \
               << "); its rlimit fallback is tested by namespace_security_serial_tests"

inline Limits limits(std::uint64_t memory_bytes, std::uint32_t pids,
                     std::optional<double> cpus = std::nullopt) {
  Limits l;
  l.memory_bytes = memory_bytes;
  l.pids = pids;
  l.cpus = cpus;
  return l;
}

}  // namespace rlm::test
