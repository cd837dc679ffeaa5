// Starting the sandbox's first process in its new namespaces: clone3 (pidfd, straight into the
// run's cgroup), falling back to clone(2) on kernels or seccomp profiles without clone3.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>

#include "host/unique_fd.hpp"

namespace rlm::ns {

struct CloneResult {
  pid_t pid = -1;            // 0 in the child, the child's pid in the parent, -1 on failure (errno)
  host::UniqueFd pidfd;      // parent only; empty when the kernel could not give one
  bool into_cgroup = false;  // the child started inside `cgroup_fd` (else attach it yourself)
};

// Fork-like (no new stack, SIGCHLD on exit): returns in the parent and in the child. `namespaces`
// holds CLONE_NEW* flags; `cgroup_fd` >= 0 asks for CLONE_INTO_CGROUP (clone3 only).
//
// The child is a raw clone of the calling thread, not a glibc fork: libc still believes it is the
// parent thread (cached thread id, thread list, locks another thread may have held), so the child
// may only make raw syscalls until it execs -- no malloc, no stdio, no pthread, no glibc set*id
// wrappers (they broadcast to threads that do not exist there). The caller blocks every signal
// around it.
CloneResult clone_process(std::uint64_t namespaces, int cgroup_fd) noexcept;

// Every signal of the calling thread blocked for the object's life, as around clone_process(): no
// host handler runs in the child, and a signal sent early stays pending for the exec'd program.
class SignalsBlocked {
 public:
  SignalsBlocked() noexcept {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous_);
  }
  ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace rlm::ns
