// Init's supervision loop: reap everything (init is a child subreaper, so orphans land here),
// forward signals to the payload, tear the whole tree down on SIGTERM or when the payload's main
// process exits, and converge even against a fork bomb.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "report.hpp"

namespace rlm::init {

// The signals init takes through its signalfd; all others keep their default action.
sigset_t supervised_signals();

class Supervisor {
 public:
  // `signal_fd` reads supervised_signals(), which the caller has blocked.
  Supervisor(pid_t payload, int signal_fd, int grace_ms);

  // Runs until the payload's main process has exited and no descendant is left. The outcome is
  // exited or signaled (a failed exec shows as the child's own exit).
  Outcome run();

 private:
  // Collects every exited child, noting the payload's status. False once no child is left.
  bool reap_exited();
  void handle_signals();
  void begin_termination();
  // SIGKILL every descendant and reap, again and again until none is left.
  void kill_everything();
  // Waits up to `timeout_ms` for a signal (-1: forever); true when one is readable.
  bool wait_for_signal(int timeout_ms);

  pid_t self_;
  pid_t payload_;
  int signal_fd_;
  int grace_ms_;
  bool payload_done_ = false;
  int payload_status_ = 0;
  rusage payload_usage_{};
  bool terminating_ = false;
  long long kill_deadline_ms_ = 0;  // CLOCK_MONOTONIC, valid while terminating_
};

}  // namespace rlm::init
