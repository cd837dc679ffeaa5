// The host uid a sandbox runs as when the runtime is root: one of its own for as long as it lives,
// from a reserved range, so that the kernel's per-user counters (inotify instances and watches, fds
// in flight, processes, POSIX message queues, user namespaces, pending signals, pipe buffers,
// epoll watches) are charged to that sandbox alone -- never shared with another sandbox, nor with
// root. The same number serves as its host gid.
//
// A slot is held by an exclusive flock(2) on the file <lock dir>/<uid>, in a directory only root
// may enter (default /run/rlm-sandbox-uid, RLM_SANDBOX_UID_LOCK_DIR): nobody else -- another local
// user, a landlock-backend payload -- can take a slot to stop sandboxes or steer the next one onto
// a uid of its choosing. The kernel releases the lock when the last fd of its open file goes, also
// when the runtime dies, so no two live holders (threads or processes) ever get the same uid. The
// files themselves stay (empty, root's): removing one could let two holders lock different files
// of one name. The first free slot of the range is taken.
#pragma once

#include <sys/types.h>

#include <string>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::host {

// The environment variable of the runtime's process that sets the range: "FIRST-LAST" (inclusive,
// decimal). Host configuration, never part of a policy.
inline constexpr const char* kUidRangeVariable = "RLM_SANDBOX_UID_RANGE";
// Where the slots' lock files are: a directory the runtime's uid owns that nobody else may enter
// (made 0700 when missing; one that is not the runtime's, is a link or lets others in is refused).
// Unset: /run/rlm-sandbox-uid, or beneath /dev/shm or /tmp where /run is missing or read-only.
inline constexpr const char* kUidLockDirVariable = "RLM_SANDBOX_UID_LOCK_DIR";
inline constexpr const char* kUidLockDirName = "rlm-sandbox-uid";
inline constexpr const char* kDefaultUidLockDir = "/run/rlm-sandbox-uid";

// The host uid (and gid) that owns what a root caller's landlock sandboxes write through
// read-write binds (sandbox_write_owner; the namespace backend idmaps them to root instead):
// RLM_SANDBOX_OUTPUT_UID, by default 1879113728, the id right after the default range. No process
// ever runs as it (it is never a sandbox's, and set-id bits are refused), so what it owns grants
// nobody anything, and the runtime follows no link it owns.
inline constexpr const char* kOutputUidVariable = "RLM_SANDBOX_OUTPUT_UID";
inline constexpr uid_t kDefaultOutputUid = 0x70010000u;

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

// Whose the files a landlock sandbox writes for `caller` become on the host, once it ended: the
// caller's own ids, except that root's become the output uid's. That backend runs in place and
// cannot idmap or mark what it wrote (namespace/written_mark.hpp): files a sandbox made that root
// owned would be trusted as root's own, since the runtime follows a link in a bind source when
// root owns it (docs/security.md #27). Throws rlm::Error when RLM_SANDBOX_OUTPUT_UID
// is malformed, 0, 65534, 65535, 4294967295 or inside the sandbox uid range.
HostIds sandbox_write_owner(const HostIds& caller);

class SandboxUid {
 public:
  // Takes the first free uid of `range`. Throws rlm::Error when every one is held (saying how to
  // widen the range) or when the lock directory cannot be used (saying why and how to fix it).
  static SandboxUid acquire(const UidRange& range);

  SandboxUid() = default;
  uid_t uid() const { return uid_; }
  bool held() const { return static_cast<bool>(lock_); }
  void release() { lock_.reset(); }
  // Never hands the uid out again while this process lives: for a sandbox that may have left
  // something of its uid's behind (owned_files.hpp). The lock's fd is kept on purpose.
  void quarantine() {
    if (lock_) (void)lock_.release();
  }

 private:
  UniqueFd lock_;  // the locked file (close-on-exec)
  uid_t uid_ = 0;
};

}  // namespace rlm::host
