// Helpers for the seccomp compiler tests: building policy rules in code and running a probe in a
// forked child under a compiled filter.
#pragma once

#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "rlm_sandbox/policy.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm::seccomp::test {

inline SeccompArg arg(unsigned index, const std::string& op, std::uint64_t value,
                      std::uint64_t value_two = 0) {
  SeccompArg a;
  a.index = index;
  a.op = op;
  a.value = value;
  a.value_two = value_two;
  return a;
}

inline SeccompRule rule(std::vector<std::string> names, std::string action,
                        std::optional<int> errno_ret = std::nullopt,
                        std::vector<SeccompArg> args = {}) {
  SeccompRule r;
  r.names = std::move(names);
  r.action = std::move(action);
  r.errno_ret = errno_ret;
  r.args = std::move(args);
  return r;
}

inline Seccomp policy(std::string default_action, std::vector<SeccompRule> rules = {}) {
  Seccomp s;
  s.default_action = std::move(default_action);
  s.syscalls = std::move(rules);
  return s;
}

// How a probe child ended.
struct ChildEnd {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
};

// An exit code for "the call returned -1 with errno e" (0 when it succeeded).
inline int errno_of(long result) {
  return result == -1 ? errno : 0;
}

// Exit codes no errno collides with.
constexpr int kSetupFailed = 249;
constexpr int kApplyFailed = 250;

// A descriptor number that is never open: unfiltered, ioctl on it fails with EBADF and does
// nothing, so another errno (or success) can only come from the filter.
constexpr int kBadFd = 1000000;

// Installs `program` on the calling thread the way rlm-sandbox-init's payload child installs the
// kill program (worker/init/seccomp_filter.cpp): no_new_privs, then seccomp(SET_MODE_FILTER).
// Filters stack and cannot be removed. 0, or -errno.
inline int install(const Program& program) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
  sock_fprog prog{static_cast<unsigned short>(program.instructions.size()),
                  const_cast<sock_filter*>(program.instructions.data())};
  return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0 ? 0 : -errno;
}

// Forks; the child turns off core dumps (seccomp kills dump core), installs `program` and exits
// with probe()'s result. Without a program the probe runs unfiltered (a control run).
template <class Probe>
ChildEnd run_child(const Program* program, Probe probe) {
  const pid_t pid = fork();
  if (pid < 0) ADD_FAILURE() << "fork failed";
  if (pid == 0) {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (program && install(*program) != 0) _exit(kApplyFailed);
    // exit_group directly: libc's and sanitizers' exit paths may make calls an allow-list lacks.
    syscall(SYS_exit_group, probe());
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ChildEnd end;
  if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) end.signal = WTERMSIG(status);
  return end;
}

template <class Probe>
ChildEnd run_filtered(const Program& program, Probe probe) {
  return run_child(&program, probe);
}

// Runs `probe` under `program` and expects the child to exit with `code`.
template <class Probe>
void expect_exit(const Program& program, int code, Probe probe, const std::string& what) {
  const ChildEnd end = run_filtered(program, probe);
  EXPECT_EQ(end.signal, 0) << what << ": killed by signal " << end.signal;
  EXPECT_EQ(end.exit_code, code) << what;
}

}  // namespace rlm::seccomp::test
