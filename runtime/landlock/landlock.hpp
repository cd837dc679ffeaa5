// Landlock (Documentation/userspace-api/landlock.rst): an unprivileged process restricts itself
// and every process it later creates to a ruleset -- filesystem rights beneath the paths the rules
// name, TCP bind/connect (ABI 4), abstract unix sockets and signals scoped to the domain (ABI 6).
// Every Landlock syscall of the runtime lives in this module; the landlock backend and the
// namespace backend's defence in depth use it.
//
// Phases: the parent prepares a ruleset (prepare_ruleset, allow_beneath: may allocate and throw);
// the child between fork and exec adds the rules only it can name (a tmpfs it mounted) with
// apply_allow_beneath and confines itself with apply_restrict_self (async-signal-safe, no
// allocation). A ruleset handles only what abi_version() knows; what it asked for and the kernel
// cannot enforce is reported by enforced() so the caller can name it as unenforced.
//
// Rules are per inode: a rule on a host directory also covers its bind mounts elsewhere, in this
// or another mount namespace.
#pragma once

#include <string>

#include "host/unique_fd.hpp"

namespace rlm::landlock {

// The kernel's Landlock ABI version: 0 when the kernel has no Landlock, it is disabled at boot
// (lsm=), or a seccomp filter refuses the syscall. Asked once per process.
int abi_version();

// The ABI a capability first appeared in.
inline constexpr int kAbiRefer = 2;     // LANDLOCK_ACCESS_FS_REFER
inline constexpr int kAbiTruncate = 3;  // LANDLOCK_ACCESS_FS_TRUNCATE
inline constexpr int kAbiTcp = 4;       // handled_access_net: bind/connect TCP
inline constexpr int kAbiIoctlDev = 5;  // LANDLOCK_ACCESS_FS_IOCTL_DEV
inline constexpr int kAbiScoped = 6;    // scoped: abstract unix sockets, signals

struct RulesetOptions {
  bool filesystem = true;            // handle every filesystem right the ABI knows
  bool deny_tcp = false;             // handle TCP bind and connect (no rule grants a port)
  bool scope_abstract_unix = false;  // no connect to abstract unix sockets outside the domain
  bool scope_signals = false;        // no signal to processes outside the domain
};

// What of `wanted` this kernel enforces (the fields it cannot are false); all false at ABI 0.
RulesetOptions enforced(const RulesetOptions& wanted);

// A ruleset being built: owns its fd (close-on-exec). Move-only.
class Ruleset {
 public:
  Ruleset() = default;
  explicit Ruleset(host::UniqueFd fd, unsigned long long handled_fs)
      : fd_(std::move(fd)), handled_fs_(handled_fs) {}
  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  unsigned long long handled_fs() const { return handled_fs_; }

 private:
  host::UniqueFd fd_;
  unsigned long long handled_fs_ = 0;
};

// Parent: creates a ruleset handling what `options` asks for, limited to abi_version(). Throws
// rlm::Error when Landlock is unavailable (saying why) or the kernel refuses the ruleset.
Ruleset prepare_ruleset(const RulesetOptions& options);

// Access to grant beneath a path (a bit set).
enum Access : unsigned { read = 1, write = 2, execute = 4 };

// The filesystem rights `access` grants at this ABI, for a directory (a file gets the subset of
// them that applies to files: apply_allow_beneath and allow_beneath trim them).
//   read: read files, list directories. write: write and truncate files, create, remove and rename
//   entries (never device nodes), ioctl on devices. execute: execute files.
unsigned long long access_bits(unsigned access);

// Parent: grants `access` beneath `host_path` (a directory: everything under it; a file: that
// file). The path is opened O_PATH|O_NOFOLLOW: a symlink as the last component is refused, never
// followed. Throws rlm::Error naming the path on failure.
void allow_beneath(Ruleset& ruleset, const std::string& host_path, unsigned access);

// Child: adds a rule granting `bits` (from access_bits, trimmed to file rights when `path` is not
// a directory) beneath `path`. 0 or -errno. Async-signal-safe.
int apply_allow_beneath(int ruleset_fd, const char* path, unsigned long long bits) noexcept;

// Child: confines the calling thread (and what it execs and forks) to the ruleset. The caller has
// set no_new_privs already (or has CAP_SYS_ADMIN). 0 or -errno. Async-signal-safe.
int apply_restrict_self(int ruleset_fd) noexcept;

}  // namespace rlm::landlock
