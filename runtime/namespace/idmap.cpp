#include "namespace/idmap.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "host/tree_walk.hpp"
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

// Through a bind idmapped to root the sandbox owns root's files there: it may write an existing
// set-uid or set-gid program, or one with file capabilities, and a write through a shared mapping
// keeps those bits (the kernel drops them for write(2) and truncation only), which would leave a
// privileged program of the payload's on the host. So such a file in a root owner's bind refuses
// the run, and so does a tree too large to be checked (host/tree_walk.hpp's bounds).
void refuse_privileged_programs(int source, const std::string& host_path,
                                const std::string& where) {
  std::string found;
  const bool walked =
      host::walk_tree(source, {}, [&](int fd, const struct stat& st, const std::string& path) {
        if (!S_ISREG(st.st_mode)) return true;
        const bool set_id =
            (st.st_mode & S_ISUID) || ((st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP));
        const std::string self = "/proc/self/fd/" + std::to_string(fd);
        if (!set_id && getxattr(self.c_str(), "security.capability", nullptr, 0) < 0) return true;
        found = (path.empty() ? host_path : host_path + "/" + path) +
                (set_id ? ", a set-uid or set-gid program" : ", a program with file capabilities");
        return false;
      });
  if (!found.empty())
    throw Error(where + ": the read-write bind of " + host_path + " holds " + found +
                ". The payload writes there as root, the owner, and could change what it runs "
                "while it stays privileged, so it does not run. To fix: bind it read-only, or bind "
                "a directory without such programs, or drop the privilege (chmod ug-s FILE, "
                "setcap -r FILE)");
  if (!walked)
    throw Error(where + ": the read-write bind of " + host_path +
                " could not be checked for set-uid, set-gid and file-capability programs (more "
                "than 1,000,000 entries or 256 levels, or a directory that cannot be read); the "
                "payload writes there as root, so it does not run. To fix: bind a smaller "
                "directory read-write, or run rlm-sandbox rootless as the user who is to own the "
                "files");
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

UniqueFd idmapped_tree(int source, const std::string& host_path, int userns,
                       const std::string& where) {
  UniqueFd tree(static_cast<int>(
      syscall(SYS_open_tree, source, "",
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
    // Opened once: the tree cloned is the directory marked (a file bind holds no link).
    UniqueFd source = open_resolved(op.host_source, O_RDONLY | O_DIRECTORY, where);
    const bool directory = static_cast<bool>(source);
    if (!directory) source = open_resolved(op.host_source, O_PATH, where);
    if (!source)
      throw Error(where + ": cannot open " + op.host_source + ": " + sys::errno_text(errno));
    // A root owner's sandbox plants links that are root's: its directories are marked, before it
    // starts, as ones whose links a bind source does not follow.
    if (owner.uid == 0) refuse_privileged_programs(source.get(), op.host_source, where);
    if (owner.uid == 0 && directory) mark_sandbox_written(source.get(), op.host_source, where);
    trees_.push_back(idmapped_tree(source.get(), op.host_source, userns.get(), where));
    op.idmapped_tree = trees_.back().get();
  }
}

}  // namespace rlm::ns
