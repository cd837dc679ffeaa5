// clone_process: clone3 into the namespaces, and the clone(2) fallback a kernel or an outer
// seccomp profile without clone3 forces (glibc's own fallback answer is ENOSYS, so is ours).
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "namespace/clone.hpp"

namespace rlm {
namespace {

constexpr std::uint64_t kNamespaces = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS;

// In the child: 0 when it is PID 1 of a new PID namespace.
[[noreturn]] void child_reports_its_pid() {
  _exit(getpid() == 1 ? 0 : 1);
}

// Clones with `kNamespaces`, waits through the pidfd, returns the child's exit code (or -errno).
int clone_and_wait() {
  auto child = ns::clone_process(kNamespaces, -1);
  if (child.pid == 0) child_reports_its_pid();
  if (child.pid < 0) return -errno;
  if (!child.pidfd) return -1000;  // both paths must give a pidfd on this kernel
  siginfo_t info{};
  if (waitid(P_PIDFD, static_cast<id_t>(child.pidfd.get()), &info, WEXITED) != 0) return -2000;
  return info.si_code == CLD_EXITED ? info.si_status : -3000;
}

TEST(CloneProcess, StartsTheChildInNewNamespacesWithAPidfd) {
  EXPECT_EQ(clone_and_wait(), 0);
}

TEST(CloneProcess, FallsBackToCloneWhenClone3IsMissing) {
  // In a throw-away child: a filter answering clone3 with ENOSYS, as an old kernel would.
  const pid_t tester = fork();
  ASSERT_GE(tester, 0);
  if (tester == 0) {
    sock_filter program[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog filter{static_cast<unsigned short>(std::size(program)), program};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &filter) != 0)
      _exit(90);
    if (syscall(SYS_clone3, nullptr, 0) >= 0 || errno != ENOSYS) _exit(91);
    const int code = clone_and_wait();
    _exit(code == 0 ? 0 : 92);
  }
  int status = 0;
  ASSERT_EQ(waitpid(tester, &status, 0), tester);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "90: no filter, 91: clone3 not ENOSYS, 92: fallback failed";
}

}  // namespace
}  // namespace rlm
