// The runtime's one way to start a child process (worker/init's payload clone aside, which shares
// init's memory). Every rule for the code between fork/clone and exec is here:
//
// - Every signal of the calling thread is blocked from before the fork/clone until after it, so no
//   host signal handler ever runs in the child, and a signal sent early stays pending for the
//   program the child execs (which sets up its own). The parent's mask is restored afterwards.
// - The child runs a copy of a process that may be multithreaded: another thread may have held
//   the malloc lock, or any other lock, at that instant. So the child function is async-signal-
//   safe: no allocation, no locks, no stdio, no exceptions; what it needs is prepared in the
//   parent. It ends in exec or _exit; should it return, the child _exits kChildReturnedExit.
// - A child that fails before its exec says so with a process::ChildFailure (child_failure.hpp)
//   on a close-on-exec pipe, which the parent reads and turns into its rlm::Error.
//
// Two kinds of child:
// - plain (ChildOptions{}): glibc's _Fork -- a process of its own as far as libc knows (it may
//   fork again), but no pthread_atfork handlers run (they may lock or allocate).
// - in new namespaces or straight into a cgroup: a raw clone3 with CLONE_PIDFD, falling back to
//   clone(2) on kernels or seccomp profiles without clone3. Fork-like (no new stack, SIGCHLD on
//   exit), but libc still believes the child is the calling thread (cached thread id, thread list,
//   locks), so the child makes raw syscalls only until it execs: not even glibc's set*id wrappers,
//   which broadcast to threads that do not exist there.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace rlm::process {

// The exit status of a child whose function returned instead of exec'ing or _exiting.
constexpr int kChildReturnedExit = 127;

struct ChildOptions {
  std::uint64_t namespaces = 0;  // CLONE_NEW* flags (a clone)
  int cgroup_fd = -1;            // >= 0: CLONE_INTO_CGROUP that cgroup v2 group (a clone)
};

struct StartedChild {
  pid_t pid = -1;            // the child's pid, -1 when it could not be started
  int error = 0;             // errno when pid is -1
  int pidfd = -1;            // a clone's pidfd (the caller owns it); -1 for a plain child or when
                             // the kernel could not give one
  bool into_cgroup = false;  // the child started inside `cgroup_fd` (else attach it yourself)
};

// Every signal of the calling thread blocked for the object's life (restored after).
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

// The fork/clone itself: returns twice, pid 0 in the child. Call start_child() instead, which
// blocks the signals around it and keeps the child from returning into the parent's code.
StartedChild fork_or_clone(const ChildOptions& options) noexcept;

// Starts a child that runs `child()` (async-signal-safe; see above), with every signal blocked
// around the start. `hold()`, called in the parent once the signals are blocked, returns an
// object that lives across the start (the namespace backend's switch to the user namespace's
// owner). Returns in the parent only; a child that could not be started has pid -1 and `error`.
template <typename Child, typename Hold>
StartedChild start_child(const ChildOptions& options, Child&& child, Hold&& hold) {
  StartedChild started;
  {
    const SignalsBlocked blocked;
    [[maybe_unused]] const auto held = hold();
    started = fork_or_clone(options);
    if (started.pid == 0) {
      std::forward<Child>(child)();
      _exit(kChildReturnedExit);
    }
    if (started.pid < 0) started.error = errno;
  }
  return started;
}

template <typename Child>
StartedChild start_child(const ChildOptions& options, Child&& child) {
  return start_child(options, std::forward<Child>(child), [] { return 0; });
}

// The clone of start_vfork_child: `run(argument)` in a child that shares the caller's memory on
// a stack of its own; returns once the child has exec'd or exited.
StartedChild vfork_clone(std::uint64_t namespaces, void (*run)(void*), void* argument) noexcept;

// A child that runs in the caller's memory, on a stack of its own, until it execs or exits
// (CLONE_VM | CLONE_VFORK, as posix_spawn does): no page tables copied and no copy-on-write
// faults in either process afterwards -- in a large, busy process most of what a fork costs. The
// calling thread waits meanwhile. `namespaces`: CLONE_NEW* flags; CLONE_INTO_CGROUP is not
// available (clone3 only), so such a child joins its cgroup itself. `child` follows the rules
// above, and one more: it writes nothing of the caller's memory but its own stack and errno.
// AddressSanitizer builds fork instead (their checks do not know a second stack).
template <typename Child>
StartedChild start_vfork_child(std::uint64_t namespaces, Child&& child) {
#if defined(__SANITIZE_ADDRESS__)
  return start_child(ChildOptions{namespaces, -1}, std::forward<Child>(child));
#else
  StartedChild started;
  const SignalsBlocked blocked;
  auto run = [](void* argument) { (*static_cast<std::remove_reference_t<Child>*>(argument))(); };
  started = vfork_clone(namespaces, run, const_cast<void*>(static_cast<const void*>(&child)));
  return started;
#endif
}

}  // namespace rlm::process
