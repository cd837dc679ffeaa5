#include "namespace/idmap.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "namespace/mounts.hpp"
#include "namespace/setup_fix.hpp"
#include "namespace/written_mark.hpp"
#include "process/child_start.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
namespace {

using host::UniqueFd;

// The helper process, killed and reaped when the object goes (it only waits to be killed).
class Helper {
 public:
  explicit Helper(pid_t pid) : pid_(pid) {}
  ~Helper() {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, __WALL) < 0 && errno == EINTR) {
    }
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;

 private:
  pid_t pid_;
};

void write_map(const std::string& path, const std::string& line) {
  const UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) throw SetupError("write " + path, errno);
  if (write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw SetupError("write " + path, errno);
}

// The source as prepare() resolved it, opened without following a link planted meanwhile.
UniqueFd open_resolved(const std::string& host_path, int flags, const std::string& where) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  UniqueFd fd(
      static_cast<int>(syscall(SYS_openat2, AT_FDCWD, host_path.c_str(), &how, sizeof how)));
  if (!fd && errno != ENOTDIR)
    throw Error(where + ": cannot open " + host_path + ": " + sys::errno_text(errno));
  return fd;
}

}  // namespace

UniqueFd owner_idmap(const HostIds& owner, uid_t host_uid, gid_t host_gid) {
  const auto child = process::start_child({.namespaces = CLONE_NEWUSER}, [] {
    // Raw syscalls only (child_start.hpp): wait to be killed, and die with the thread that made us.
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    for (;;) syscall(SYS_pause);
  });
  if (child.pid < 0) throw SetupError("clone of the bind owner's user namespace", child.error);
  const UniqueFd pidfd(child.pidfd);  // unused: closed with the helper
  const Helper helper(child.pid);
  const std::string base = "/proc/" + std::to_string(child.pid) + "/";
  write_map(base + "uid_map", std::to_string(owner.uid) + " " + std::to_string(host_uid) + " 1\n");
  write_map(base + "gid_map", std::to_string(owner.gid) + " " + std::to_string(host_gid) + " 1\n");
  UniqueFd userns(open((base + "ns/user").c_str(), O_RDONLY | O_CLOEXEC));
  if (!userns) throw SetupError("open " + base + "ns/user", errno);
  return userns;
}

UniqueFd idmapped_tree(const std::string& host_path, int userns, const std::string& where) {
  const UniqueFd source = open_resolved(host_path, O_PATH, where);
  if (!source) throw Error(where + ": cannot open " + host_path + ": " + sys::errno_text(errno));
  UniqueFd tree(static_cast<int>(
      syscall(SYS_open_tree, source.get(), "",
              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE)));
  if (!tree)
    throw Error(where + ": cannot clone the mount of " + host_path +
                " to idmap it: " + sys::errno_text(errno));
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.userns_fd = static_cast<std::uint64_t>(userns);
  if (syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
              sizeof attr) != 0) {
    const int error = errno;
    throw Error(where + ": the read-write bind of " + host_path +
                " cannot be idmapped to its owner (" + sys::errno_text(error) +
                (error == EINVAL ? ": its filesystem, or one mounted below it, does not support "
                                   "idmapped mounts"
                                 : "") +
                "); files the sandbox wrote there would belong to the sandbox's own host uid, "
                "which a later sandbox may be given, so it does not run. To fix: bind a directory "
                "on a filesystem that supports idmapped mounts (ext4, xfs, btrfs, tmpfs, "
                "overlayfs on Linux 5.19+), or run rlm-sandbox rootless as the user who is to own "
                "the files");
  }
  return tree;
}

bool RootfsPlan::has_writable_binds() const {
  for (const Op& op : ops_)
    if (!op.writable_bind_at.empty()) return true;
  return false;
}

void RootfsPlan::idmap_writable_binds(const HostIds& owner, uid_t host_uid, gid_t host_gid) {
  if (!has_writable_binds()) return;
  const UniqueFd userns = owner_idmap(owner, host_uid, host_gid);
  for (Op& op : ops_) {
    if (op.writable_bind_at.empty()) continue;
    const std::string where = op.writable_bind_at + ".source";
    trees_.push_back(idmapped_tree(op.host_source, userns.get(), where));
    op.idmapped_tree = trees_.back().get();
    // A root owner's sandbox plants links that are root's: its directories are marked, before it
    // starts, as ones whose links a bind source does not follow. A file bind holds no link.
    if (owner.uid == 0) {
      const UniqueFd dir = open_resolved(op.host_source, O_RDONLY | O_DIRECTORY, where);
      if (dir) mark_sandbox_written(dir.get(), op.host_source, where);
    }
  }
}

}  // namespace rlm::ns
