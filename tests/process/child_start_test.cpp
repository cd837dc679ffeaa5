// process::start_child and process::ChildFailure: a failing child's record reaches the parent
// with its step and errno, an exec'ing child reports nothing, the parent's signal mask comes back
// (the child's is all blocked), and a clone's namespace flags take effect.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "process/child_failure.hpp"
#include "process/child_start.hpp"

namespace rlm {
namespace {

using process::ChildFailure;
using process::ChildReport;

// A close-on-exec pipe, closed when done.
struct RecordPipe {
  int read = -1, write = -1;
  RecordPipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      read = fds[0];
      write = fds[1];
    }
  }
  ~RecordPipe() {
    if (read >= 0) close(read);
    if (write >= 0) close(write);
  }
  void close_write() { close(std::exchange(write, -1)); }
};

// The child's exit code, or -1 when it did not exit normally.
int exit_code(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

sigset_t current_mask() {
  sigset_t mask;
  sigemptyset(&mask);
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return mask;
}

bool same_mask(const sigset_t& a, const sigset_t& b) {
  for (int signal = 1; signal < NSIG; ++signal)
    if (sigismember(&a, signal) != sigismember(&b, signal)) return false;
  return true;
}

TEST(ChildStart, AFailingStepArrivesAsTheRecordWithItsStepAndErrno) {
  RecordPipe pipe;
  ASSERT_GE(pipe.read, 0);
  const int write_end = pipe.write;
  const auto child = process::start_child({}, [write_end] {
    if (open("/nonexistent/rlm-child-start", O_RDONLY | O_CLOEXEC) < 0)
      process::exit_with_failure(write_end,
                                 ChildFailure::at("open /nonexistent/rlm-child-start", errno), 7);
    _exit(0);
  });
  ASSERT_GT(child.pid, 0) << strerror(child.error);
  EXPECT_EQ(child.pidfd, -1) << "a plain child has no pidfd";
  pipe.close_write();
  const auto report = process::read_child_report(pipe.read, 10'000);
  ASSERT_EQ(report.kind, ChildReport::Kind::failed);
  EXPECT_STREQ(report.failure.step, "open /nonexistent/rlm-child-start");
  EXPECT_EQ(report.failure.error, ENOENT);
  EXPECT_EQ(exit_code(child.pid), 7);
}

TEST(ChildStart, AChildThatExecsReportsNothing) {
  RecordPipe pipe;
  ASSERT_GE(pipe.read, 0);
  const int write_end = pipe.write;
  static char true_path[] = "/bin/true";
  static char* const argv[] = {true_path, nullptr};
  const auto child = process::start_child({}, [write_end] {
    execve(argv[0], argv, environ);
    process::exit_with_failure(write_end, ChildFailure::at("execve /bin/true", errno), 127);
  });
  ASSERT_GT(child.pid, 0) << strerror(child.error);
  pipe.close_write();
  const auto report = process::read_child_report(pipe.read, 10'000);
  EXPECT_EQ(report.kind, ChildReport::Kind::exec) << report.failure.step;
  EXPECT_FALSE(report.failure.failed());
  EXPECT_EQ(exit_code(child.pid), 0);
}

TEST(ChildStart, AChildStillRunningPastTheTimeoutIsReportedAsTimedOut) {
  RecordPipe pipe;
  ASSERT_GE(pipe.read, 0);
  RecordPipe release;  // the child waits for its EOF, holding the record's write end
  ASSERT_GE(release.read, 0);
  const int wait_on = release.read, own_copy = release.write;
  const auto child = process::start_child({}, [wait_on, own_copy] {
    close(own_copy);  // EOF comes when the parent closes its end
    char c;
    while (read(wait_on, &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  });
  ASSERT_GT(child.pid, 0);
  pipe.close_write();
  EXPECT_EQ(process::read_child_report(pipe.read, 50).kind, ChildReport::Kind::timed_out);
  release.close_write();
  EXPECT_EQ(exit_code(child.pid), 0);
}

TEST(ChildStart, TheParentsMaskComesBackAndTheChildStartsWithEverySignalBlocked) {
  sigset_t only_usr1;
  sigemptyset(&only_usr1);
  sigaddset(&only_usr1, SIGUSR1);
  sigset_t saved;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &only_usr1, &saved), 0);
  const auto child = process::start_child({}, [] {
    sigset_t mask;
    sigemptyset(&mask);
    sigprocmask(SIG_BLOCK, nullptr, &mask);
    _exit(sigismember(&mask, SIGTERM) == 1 && sigismember(&mask, SIGCHLD) == 1 ? 0 : 1);
  });
  const sigset_t after = current_mask();
  // A hold that throws: the mask comes back all the same.
  EXPECT_THROW(process::start_child(
                   {}, [] { _exit(0); }, []() -> int { throw std::runtime_error("no"); }),
               std::runtime_error);
  const sigset_t after_throw = current_mask();
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  ASSERT_GT(child.pid, 0);
  EXPECT_TRUE(same_mask(after, only_usr1));
  EXPECT_TRUE(same_mask(after_throw, only_usr1));
  EXPECT_EQ(exit_code(child.pid), 0) << "the child did not start with every signal blocked";
}

TEST(ChildStart, AChildFunctionThatReturnsExitsWithItsOwnCode) {
  const auto child = process::start_child({}, [] {});
  ASSERT_GT(child.pid, 0);
  EXPECT_EQ(exit_code(child.pid), process::kChildReturnedExit);
}

TEST(ChildStart, CloneFlagsTakeEffect) {
  // PID 1 of a new PID namespace, in a new user namespace without maps (ids show as overflow).
  const auto child = process::start_child({CLONE_NEWUSER | CLONE_NEWPID, -1}, [] {
    const bool pid1 = syscall(SYS_getpid) == 1;
    const bool unmapped = syscall(SYS_geteuid) == 65534;
    _exit(pid1 && unmapped ? 0 : (pid1 ? 2 : 1));
  });
  ASSERT_GT(child.pid, 0) << strerror(child.error);
  EXPECT_GE(child.pidfd, 0) << "a clone gives a pidfd";
  if (child.pidfd >= 0) close(child.pidfd);
  EXPECT_EQ(exit_code(child.pid), 0) << "1: not PID 1, 2: not in a new user namespace";
}

TEST(ChildFailure, AStepLongerThanTheRecordIsCutAndTerminated) {
  const std::string longer(ChildFailure::kStepCapacity + 100, 'x');
  const auto failure = ChildFailure::at(longer.c_str(), EPERM);
  EXPECT_EQ(std::strlen(failure.step), ChildFailure::kStepCapacity - 1);
  EXPECT_EQ(failure.error, EPERM);
  EXPECT_TRUE(failure.failed());
  EXPECT_FALSE(ChildFailure{}.failed());
  EXPECT_STREQ(ChildFailure::at(nullptr, EIO).step, "");
}

}  // namespace
}  // namespace rlm
