// RootfsPlan::apply(): the plan's operations replayed in the cloned child, between clone and exec,
// with raw syscalls only -- no allocation, no locks (mounts.hpp, child_setup.hpp).
//
// Before pivot_root the paths are the host's own (/, /tmp). After it, every path is resolved
// inside the new root with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS): read-write binds hold
// whatever earlier sandboxes left there, and a link they planted must never lead a mkdir, a file
// or a mount out of the tree (say into /.rlm-old-root, the host root). Mounts then name their
// source and target by descriptor, through the host procfs' /proc/self/fd, which the kernel
// resolves to exactly the opened object.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <initializer_list>

#include "namespace/mounts.hpp"

namespace rlm::ns {

namespace {

// Keeps errno across the close() calls of cleanup.
void close_keeping_errno(int fd) noexcept {
  if (fd < 0) return;
  const int saved = errno;
  ::close(fd);
  errno = saved;
}

// `path` (absolute, in the new root) opened without following any symlink, magic links included,
// and without leaving `root`: ELOOP when a component is a link.
int open_in_root(int root, const char* path, int flags) noexcept {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how));
}

// "/.rlm-old-root/proc/self/fd/<fd>": a path mount(2) resolves to exactly what `fd` refers to
// (the host's procfs, reachable until the host root is detached; "self" is this process there).
struct FdPath {
  char text[64];
};
FdPath fd_path(int fd) noexcept {
  FdPath out{};
  std::size_t at = 0;
  for (const char* prefix : {kOldRoot, "/proc/self/fd/"})
    for (; *prefix != '\0'; ++prefix) out.text[at++] = *prefix;
  char digits[16];
  std::size_t count = 0;
  auto value = static_cast<unsigned>(fd);
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0 && count < sizeof digits);
  while (count > 0) out.text[at++] = digits[--count];
  out.text[at] = '\0';
  return out;
}

// The parent directory of an operation's path, opened in the new root.
class Parent {
 public:
  Parent(int root, const std::string& parent) noexcept
      : fd_(open_in_root(root, parent.c_str(), O_PATH | O_DIRECTORY)) {}
  Parent() noexcept : fd_(AT_FDCWD) {}  // absolute paths, resolved as they are
  ~Parent() {
    if (fd_ != AT_FDCWD) close_keeping_errno(fd_);
  }
  bool valid() const noexcept { return fd_ >= 0 || fd_ == AT_FDCWD; }
  Parent(const Parent&) = delete;
  Parent& operator=(const Parent&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// An existing entry where the plan creates one: fine when it is a directory (or, for a file mount
// point, anything but one), never when it is a symlink.
bool existing_is(int dir, const char* name, bool want_directory) noexcept {
  struct stat info;
  if (::fstatat(dir, name, &info, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (S_ISLNK(info.st_mode)) {
    errno = ELOOP;
    return false;
  }
  if (S_ISDIR(info.st_mode) != want_directory) {
    errno = want_directory ? ENOTDIR : EISDIR;
    return false;
  }
  return true;
}

bool write_all(int fd, const std::string& contents) noexcept {
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

const char* or_null(const std::string& s) noexcept {
  return s.empty() ? nullptr : s.c_str();
}

}  // namespace

bool RootfsPlan::apply(process::ChildFailure& failure) const noexcept {
  // Before pivot_root the paths are the host's own (/, /tmp); afterwards `root` is the new root
  // and every path is resolved inside it.
  int root = -1;

  // A mount whose source (binds) and target are opened in the new root first.
  auto mount_in_root = [&root](const Op& op) noexcept -> bool {
    const int target = open_in_root(root, op.path.c_str(), O_PATH);
    if (target < 0) return false;
    int source = -1;
    if ((op.flags & MS_BIND) && !(op.flags & MS_REMOUNT)) {
      source = open_in_root(root, op.source.c_str(), O_PATH);
      if (source < 0) {
        close_keeping_errno(target);
        return false;
      }
    }
    const FdPath target_path = fd_path(target);
    const FdPath source_path = fd_path(source);
    const int rc = ::mount(source >= 0 ? source_path.text : or_null(op.source), target_path.text,
                           or_null(op.fstype), op.flags, or_null(op.data));
    close_keeping_errno(source);
    close_keeping_errno(target);
    return rc == 0;
  };

  // An idmapped read-write bind (idmap.hpp): the parent's detached tree attached at the target.
  auto attach_in_root = [&root](const Op& op) noexcept -> bool {
    const int target = open_in_root(root, op.path.c_str(), O_PATH);
    if (target < 0) return false;
    const long rc = ::syscall(SYS_move_mount, op.idmapped_tree, "", target, "",
                              MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
    close_keeping_errno(target);
    return rc == 0;
  };

  auto run = [&](const Op& op) noexcept -> bool {
    const char* path = op.path.c_str();
    switch (op.kind) {
      case Op::Kind::mount: {
        bool ok;
        if (op.idmapped_tree >= 0 && root >= 0)
          ok = attach_in_root(op);
        else if (root < 0 || op.path == "/" || op.sandbox_built)
          ok = ::mount(or_null(op.source), path, or_null(op.fstype), op.flags, or_null(op.data)) ==
               0;
        else
          ok = mount_in_root(op);
        return ok || (op.unreachable_ok && (errno == ENOENT || errno == EACCES || errno == EINVAL));
      }
      case Op::Kind::mkdir: {
        if (root < 0 || op.sandbox_built)
          return ::mkdir(path, op.mode) == 0 || (op.exists_ok && errno == EEXIST);
        const Parent dir(root, op.parent);
        if (dir.get() < 0) return false;
        if (::mkdirat(dir.get(), op.leaf.c_str(), op.mode) == 0) return true;
        return errno == EEXIST && op.exists_ok && existing_is(dir.get(), op.leaf.c_str(), true);
      }
      case Op::Kind::touch:  // a file mount point: write_file with no contents
      case Op::Kind::write_file: {
        // Sandbox-built: the plain path, from the new root (the current directory after pivot).
        const Parent dir = op.sandbox_built ? Parent() : Parent(root, op.parent);
        if (!dir.valid()) return false;
        const int fd =
            ::openat(dir.get(), op.sandbox_built ? path : op.leaf.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, op.mode);
        if (fd < 0)
          return errno == EEXIST && op.exists_ok &&
                 existing_is(dir.get(), op.sandbox_built ? path : op.leaf.c_str(), false);
        if (!write_all(fd, op.data)) {
          close_keeping_errno(fd);
          return false;
        }
        return ::close(fd) == 0;
      }
      case Op::Kind::symlink: {
        if (op.sandbox_built) return ::symlink(op.source.c_str(), path) == 0;
        const Parent dir(root, op.parent);
        return dir.get() >= 0 && ::symlinkat(op.source.c_str(), dir.get(), op.leaf.c_str()) == 0;
      }
      case Op::Kind::pivot_root:
        // pivot_root(".", put_old) from inside the new root: both paths stay short and relative.
        if (::chdir(path) != 0 || ::syscall(SYS_pivot_root, ".", op.source.c_str()) != 0 ||
            ::chdir("/") != 0)
          return false;
        root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        return root >= 0;
      case Op::Kind::detach:
        return ::umount2(path, MNT_DETACH) == 0;
      case Op::Kind::rmdir:
        return ::rmdir(path) == 0;
      case Op::Kind::chdir: {
        if (root < 0) return ::chdir(path) == 0;
        const int dir = open_in_root(root, path, O_PATH | O_DIRECTORY);
        if (dir < 0) return false;
        const bool ok = ::fchdir(dir) == 0;
        close_keeping_errno(dir);
        return ok;
      }
    }
    errno = EINVAL;
    return false;
  };
  bool ok = true;
  for (const Op& op : ops_) {
    if (!run(op)) {
      failure.set(op.step.c_str(), errno);
      ok = false;
      break;
    }
  }
  close_keeping_errno(root);
  return ok;
}

}  // namespace rlm::ns
