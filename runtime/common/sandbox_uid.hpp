// The host uid a sandbox runs as when the runtime is root: one of its own for as long as it lives,
// from a reserved range, so that the kernel's per-user counters (inotify instances and watches, fds
// in flight, processes, POSIX message queues, user namespaces, pending signals, pipe buffers,
// epoll watches) are charged to that sandbox alone -- never shared with another sandbox, nor with
// root. The same number serves as its host gid.
//
// A slot is held by binding the abstract unix socket "rlm-sandbox/uid/<uid>" in the runtime's
// network namespace; the kernel releases it when the last fd of that socket closes, also when the
// runtime dies, so nothing is left behind and no two live holders (threads or processes) ever get
// the same uid. The first free slot of the range is taken.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/unique_fd.hpp"

namespace rlm::common {

// The environment variable of the runtime's process that sets the range: "FIRST-LAST" (inclusive,
// decimal). Host configuration, never part of a policy.
inline constexpr const char* kUidRangeVariable = "RLM_SANDBOX_UID_RANGE";

struct UidRange {
  // Default: 65536 ids from 0x70000000 (1879048192-1879113727), in the band systemd's UID/GID
  // table leaves unused: above the container ranges (524288-1879048191) and the default
  // /etc/subuid allocations (100000-600100000), below the "foreign" range 0x7FFE0000 and 2^31.
  uid_t first = 0x70000000u;
  uid_t last = 0x70000000u + 0xFFFFu;

  std::string describe() const;  // "1879048192-1879113727"
};

// The range from RLM_SANDBOX_UID_RANGE, or the default when it is unset. Throws rlm::Error naming
// the variable when its value is not "FIRST-LAST", is reversed, or includes an id that must never
// be handed out (0, 65534 nobody, 65535 and 4294967295, the 16- and 32-bit -1).
UidRange sandbox_uid_range();

// Parses "FIRST-LAST"; throws rlm::Error as above (`origin` names where the text came from).
UidRange parse_uid_range(const std::string& text, const std::string& origin);

class SandboxUid {
 public:
  // Takes the first free uid of `range`. Throws rlm::Error when every one is held (saying how to
  // widen the range) or when no socket can be made.
  static SandboxUid acquire(const UidRange& range);

  SandboxUid() = default;
  uid_t uid() const { return uid_; }
  bool held() const { return static_cast<bool>(lock_); }
  void release() { lock_.reset(); }

 private:
  UniqueFd lock_;  // the bound abstract socket (close-on-exec)
  uid_t uid_ = 0;
};

}  // namespace rlm::common
