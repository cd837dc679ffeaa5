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

// Whether `name` in the directory `dir_fd` ("" for dir_fd itself) carries security.capability,
// looked at without following a link: getxattrat (Linux 6.13), else through /proc/self/fd.
bool has_file_capabilities(int dir_fd, const char* name) {
#ifndef SYS_getxattrat
  constexpr long SYS_getxattrat = 464;
#endif
  struct {
    std::uint64_t value;
    std::uint32_t size;
    std::uint32_t flags;
  } args{0, 0, 0};
  const long size =
      syscall(SYS_getxattrat, dir_fd, name, AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH),
              "security.capability", &args, sizeof args);
  if (size >= 0) return true;
  if (errno != ENOSYS) return false;
  // The last component is not followed (lgetxattr); the fd's own magic link must be (getxattr).
  const std::string fd_path = "/proc/self/fd/" + std::to_string(dir_fd);
  return *name ? lgetxattr((fd_path + "/" + name).c_str(), "security.capability", nullptr, 0) >= 0
               : getxattr(fd_path.c_str(), "security.capability", nullptr, 0) >= 0;
}

// Through a bind idmapped to root the sandbox owns root's files there: it may write an existing
// set-uid or set-gid program, or one with file capabilities, and a write through a shared mapping
// keeps those bits (the kernel drops them for write(2) and truncation only), which would leave a
// privileged program of the payload's on the host. So such a file in a root owner's bind refuses
// the run, and so does a tree too large to be checked (host/tree_walk.hpp's bounds).
void refuse_privileged_programs(int source, const std::string& host_path,
                                const std::string& where) {
  std::string found;
  const bool walked = host::walk_tree(source, {}, [&](const host::TreeEntry& entry) {
    if (!S_ISREG(entry.st.st_mode)) return true;
    const auto mode = entry.st.st_mode;
    const bool set_id = (mode & S_ISUID) || ((mode & S_ISGID) && (mode & S_IXGRP));
    if (!set_id && !has_file_capabilities(entry.dir_fd, entry.name)) return true;
    found = (entry.path.empty() ? host_path : host_path + "/" + entry.path) +
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

std::vector<std::string> RootfsPlan::writable_bind_sources() const {
  std::vector<std::string> sources;
  for (const Op& op : ops_)
    if (!op.writable_bind_at.empty()) sources.push_back(op.host_source);
  return sources;
}

bool RootfsPlan::has_writable_binds() const {
  for (const Op& op : ops_)
    if (!op.writable_bind_at.empty()) return true;
  return false;
}

bool RootfsPlan::idmap_writable_binds(const HostIds& owner, uid_t host_uid, gid_t host_gid) {
  if (!has_writable_binds()) return true;
  // Root's may fall back (built_sandbox.cpp): its sandbox then writes as its own uid, and what it
  // wrote is given to the output uid. Anyone else's files must be their own, or nothing runs.
  const bool root = owner.uid == 0;
  UniqueFd userns;
  try {
    userns = owner_idmap(owner, host_uid, host_gid);
  } catch (const Error&) {
    if (root) return false;
    throw;
  }
  struct Source {
    Op* op;
    UniqueFd fd;
    bool directory;
    std::string where;
  };
  std::vector<Source> sources;
  for (Op& op : ops_) {
    if (op.writable_bind_at.empty()) continue;
    std::string where = op.writable_bind_at + ".source";
    // Opened once: the tree cloned is the one checked and marked (a file bind holds no link).
    UniqueFd fd = open_resolved(op.host_source, O_RDONLY | O_DIRECTORY, where);
    const bool directory = static_cast<bool>(fd);
    if (!directory) fd = open_resolved(op.host_source, O_PATH, where);
    if (!fd) throw Error(where + ": cannot open " + op.host_source + ": " + sys::errno_text(errno));
    sources.push_back({&op, std::move(fd), directory, std::move(where)});
  }
  std::vector<UniqueFd> trees;
  for (const auto& source : sources) {
    try {
      trees.push_back(
          idmapped_tree(source.fd.get(), source.op->host_source, userns.get(), source.where));
    } catch (const Error&) {
      if (root) return false;
      throw;
    }
  }
  // A root owner's sandbox owns root's files there, and plants links that are root's: no
  // privileged program may be in reach, and the directories are marked, before it starts, as
  // ones whose links a bind source does not follow.
  if (root)
    for (const auto& source : sources) {
      refuse_privileged_programs(source.fd.get(), source.op->host_source, source.where);
      if (source.directory)
        mark_sandbox_written(source.fd.get(), source.op->host_source, source.where);
    }
  for (std::size_t i = 0; i < sources.size(); ++i) {
    sources[i].op->idmapped_tree = trees[i].get();
    trees_.push_back(std::move(trees[i]));
  }
  return true;
}

}  // namespace rlm::ns
