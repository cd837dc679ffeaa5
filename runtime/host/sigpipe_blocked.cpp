#include "host/sigpipe_blocked.hpp"

#include <pthread.h>
#include <signal.h>

#include <ctime>

namespace rlm::host {

SigpipeBlocked::SigpipeBlocked() {
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  was_blocked_ = sigismember(&old, SIGPIPE) == 1;
}

SigpipeBlocked::~SigpipeBlocked() {
  if (was_blocked_) return;
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  // Pending for this thread only when a write of ours raised it: take it, then unblock.
  const timespec now{0, 0};
  while (sigtimedwait(&pipe, nullptr, &now) == SIGPIPE) {
  }
  pthread_sigmask(SIG_UNBLOCK, &pipe, nullptr);
}

}  // namespace rlm::host
