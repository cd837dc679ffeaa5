// OpenSSL writes to its socket with write(): to a peer that has gone, that raises SIGPIPE, whose
// default action would end the whole runtime (a server with every tenant's runs, or the host
// program that embeds the library). While one of these lives, SIGPIPE is blocked for the calling
// thread (the signal is thread-directed); any that came is taken off before the thread's mask is
// restored.
#pragma once

namespace rlm::host {

class SigpipeBlocked {
 public:
  SigpipeBlocked();
  ~SigpipeBlocked();
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  bool was_blocked_ = false;
};

}  // namespace rlm::host
