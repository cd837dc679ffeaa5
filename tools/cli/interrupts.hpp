// SIGINT, SIGTERM and SIGHUP sent to the CLI while it runs a payload (a Ctrl-C, a CI runner's
// cancel, a closed terminal). Left to their default they killed the CLI with no Result, and the
// payload's own handler never ran. Caught instead, into a pipe whose read end is the run's
// Request::stop_fd: the run stops as `interrupted` -- the payload gets SIGTERM and the policy's
// kill grace, directly or through a server -- and the CLI still prints the Result and exits 128+N.
//
// Caught, not blocked: a blocked mask would cross fork and exec into every child the runtime
// starts, while a caught signal reverts to its default in the program a child execs (and the
// runtime blocks every signal between its fork and that exec).
#pragma once

#include "rlm_sandbox/result.hpp"

namespace rlm::cli {

class Interrupts {
 public:
  Interrupts();   // installs the handlers; throws Error when the pipe cannot be made
  ~Interrupts();  // restores the handlers that were there
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;

  int stop_fd() const { return read_fd_; }  // readable once a signal came
  int caught() const;                       // the first signal that came, 0 for none

  // A Result the runtime stopped for one of them names it: its signal (exit 128+N), its detail.
  void explain(Result& result) const;

 private:
  int read_fd_ = -1, write_fd_ = -1;
};

}  // namespace rlm::cli
