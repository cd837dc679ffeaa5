// The root filesystem's parts (RootfsPlan, child_setup.hpp), one file each:
//   mounts_plan.cpp   prepare(), in the parent: the policy -> a flat list of operations (Op);
//   mounts_host.cpp   what prepare() reads from the host: mount flags, the host's mounts, bind
//                     sources resolved without following a link a sandbox may have planted;
//   mounts_apply.cpp  apply(), in the cloned child: the operations replayed with raw syscalls.
// docs/namespace-rootfs.md describes the resulting tree.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>

#include "namespace/child_setup.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

// Where the host root sits once the new root is in place, until it is detached: every bind is
// taken from under it, and the child reaches the host's procfs through it.
inline constexpr const char* kOldRoot = "/.rlm-old-root";

// One step of the plan; each owns the strings it passes to the kernel, so apply() allocates
// nothing.
struct RootfsPlan::Op {
  enum class Kind { mount, mkdir, touch, symlink, write_file, pivot_root, detach, rmdir, chdir };
  Kind kind = Kind::mount;
  std::string step;    // what ChildFailure names, e.g. "bind /usr"
  std::string path;    // the object of the operation (mount target, directory, file, link)
  std::string parent;  // path's directory and last component, for the *at() calls
  std::string leaf;
  std::string source;  // mount source, symlink contents, pivot_root's put_old
  std::string fstype;
  std::string data;  // mount options, file contents
  unsigned long flags = 0;
  mode_t mode = 0;
  bool exists_ok = false;  // mkdir/touch: an existing entry is fine
  // A submount remount whose mount point is hidden by a later mount or not reachable by the
  // sandbox uid: whatever the sandbox cannot reach needs no flags.
  bool unreachable_ok = false;
  // The path lies in a tree the sandbox builds itself after pivot_root (/dev, /proc): a fresh
  // tmpfs or procfs no policy mount may reach into, so nothing from an earlier sandbox can have
  // planted a link in it, and plain path syscalls do what openat2 would (at a fraction of the
  // calls: no descriptor per operation, no magic-link walk through the host procfs).
  bool sandbox_built = false;
  // A read-write bind of the policy: its JSON path and resolved host source, and, once the parent
  // idmapped it (idmap_writable_binds), the detached tree apply() attaches instead of binding.
  std::string writable_bind_at;
  std::string host_source;
  int idmapped_tree = -1;
};

// prepare()'s errors: `where` is the JSON path of what cannot be honoured
// ("filesystem.mounts[3].source: /opt/x does not exist on the host").
[[noreturn]] inline void fail_at(const std::string& where, const std::string& message) {
  throw Error(where + ": " + message);
}

// ---- The host, as prepare() reads it (parent only; each throws rlm::Error naming `where`). ----

// The per-mount flags the kernel locks on mounts a user namespace inherits (MS_RDONLY, MS_NOSUID,
// MS_NODEV, MS_NOEXEC) of the mount holding `host_path`: a bind remount must repeat them.
unsigned long locked_flags_of(const std::string& host_path, const std::string& where);

// Every mount point of the host's mount namespace with those flags of that mount. A path mounted
// over several times keeps the last (topmost) entry: that is the one a path reaches.
std::map<std::string, unsigned long> read_host_mounts();

// A bind source resolved on the host like realpath(3), except that a symlink is followed only when
// root or the runtime's own user owns it, the directory holding it is theirs and nobody else may
// write it, and no directory it is in carries the mark of a sandbox's writes (written_mark.hpp).
// nullopt with errno set when a component is missing or unreadable; throws for a link it will not
// follow.
std::optional<std::string> resolve_host_source(const std::string& source, const std::string& where);

}  // namespace rlm::ns
