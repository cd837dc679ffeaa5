// Init's supervision loop: reap everything (init is a child subreaper, so orphans land here),
// forward signals to the payload, tear the whole tree down on SIGTERM or when the payload's main
// process exits, and converge even against a fork bomb.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>

#include "report.hpp"
#include "seccomp_filter.hpp"
#include "signal_guard.hpp"

namespace rlm::init {

// The signals init takes through its signalfd; all others keep their default action.
sigset_t supervised_signals();

class Supervisor {
 public:
  // `signal_fd` reads supervised_signals(), which the caller has blocked. `listener` is the
  // payload filter's notify listener (fd -1 for none). `pid1`: init is PID 1 of a PID namespace,
  // so every other process in it is a descendant and kill(-1) reaches exactly those. `guard`:
  // decides the listener's notifications for guarded syscalls (nullptr: --guard-signals is off).
  // `host_fd`: await mode's socket (-1: none); when the host's end closes, the whole tree is
  // killed at once.
  Supervisor(pid_t payload, int signal_fd, int grace_ms, NotifyListener& listener, bool pid1,
             const SignalGuard* guard = nullptr, int host_fd = -1);

  // Runs until the payload's main process has exited and no descendant is left. The outcome is
  // exited or signaled (a failed exec shows as the child's own exit), with seccomp_syscall set
  // when a notification ended the run.
  Outcome run();

 private:
  // Collects every exited child, noting the payload's status. False once no child is left.
  bool reap_exited();
  void handle_signals();
  // Whether the SIGTERM init read came from inside the sandbox (protocol: terminated_by_payload).
  bool sent_from_inside(const signalfd_siginfo& info) const;
  // A denied syscall: kill the tree before the held call can return, then answer it.
  void handle_notification();
  void begin_termination();
  // Sends `signal` to every descendant (not init itself).
  void signal_tree(int signal);
  // SIGKILL every descendant and reap, again and again until none is left.
  void kill_everything();
  // Waits up to `timeout_ms` for a signal or a notification (-1: forever); true when a signal is
  // readable. Notifications are handled here.
  bool wait_for_signal(int timeout_ms);
  // The await socket is readable: EOF (or a reset) means the host is gone; stray bytes are dropped.
  void handle_host();

  pid_t self_;
  pid_t launcher_;  // init's parent when it started: the runtime
  pid_t payload_;
  int signal_fd_;
  int grace_ms_;
  NotifyListener& listener_;
  bool pid1_;
  const SignalGuard* guard_;
  int host_fd_;
  bool host_gone_ = false;    // the host's end of the await socket closed
  int seccomp_syscall_ = -1;  // the first syscall a notification reported
  bool payload_done_ = false;
  int payload_status_ = 0;
  rusage payload_usage_{};
  bool terminating_ = false;
  bool terminated_by_payload_ = false;
  long long kill_deadline_ms_ = 0;  // CLOCK_MONOTONIC, valid while terminating_
};

}  // namespace rlm::init
