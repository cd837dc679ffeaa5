// What RootfsPlan::prepare() reads from the host (mounts.hpp): the flags the kernel locks on
// inherited mounts, the host's mount table, and bind sources resolved without following a link a
// sandbox may have planted. Parent only; everything here may allocate and throws rlm::Error.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <deque>
#include <sstream>

#include "namespace/mounts.hpp"
#include "namespace/written_mark.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
// The per-mount flags the kernel locks on mounts a user namespace inherits: a bind remount must
// repeat them or fails with EPERM. statvfs' ST_* values are not the MS_* ones (ST_RELATIME is
// MS_BIND's bit), so they are translated. Atime flags are left out on purpose: a remount that
// names none keeps the mount's own, which is exactly what the lock requires.
unsigned long locked_flags_of(const std::string& host_path, const std::string& where) {
  struct statvfs vfs {};
  if (statvfs(host_path.c_str(), &vfs) != 0)
    fail_at(where, "cannot read the mount flags of " + host_path + ": " + sys::errno_text(errno));
  unsigned long flags = 0;
  if (vfs.f_flag & ST_RDONLY) flags |= MS_RDONLY;
  if (vfs.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (vfs.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (vfs.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  return flags;
}

std::map<std::string, unsigned long> read_host_mounts() {
  const auto text = sys::self_mountinfo();
  if (!text) throw Error("cannot read /proc/self/mountinfo: " + sys::errno_text(errno));
  std::map<std::string, unsigned long> mounts;
  for (const auto& mount : sys::parse_mountinfo(*text)) {
    unsigned long flags = 0;
    std::istringstream list(mount.options);
    for (std::string option; std::getline(list, option, ',');) {
      if (option == "ro") flags |= MS_RDONLY;
      if (option == "nosuid") flags |= MS_NOSUID;
      if (option == "nodev") flags |= MS_NODEV;
      if (option == "noexec") flags |= MS_NOEXEC;
    }
    mounts[mount.mount_point] = flags;
  }
  return mounts;
}

// Sandboxes run as other host uids (each its own uid of the sandbox range when the runtime is
// root), so a link one of them planted in a directory it could write, through a read-write bind,
// is never followed into a later sandbox's view of the host; a root owner's sandboxes write as
// root, so their directories carry a mark instead (written_mark.hpp).
std::optional<std::string> resolve_host_source(const std::string& source,
                                               const std::string& where) {
  constexpr int kMaxLinks = 40;  // the kernel's own limit
  std::deque<std::string> rest;
  const auto push_front = [&](const std::string& path) {
    std::deque<std::string> parts;
    std::istringstream in(path);
    for (std::string part; std::getline(in, part, '/');)
      if (!part.empty() && part != ".") parts.push_back(part);
    rest.insert(rest.begin(), parts.begin(), parts.end());
  };
  push_front(source);
  std::string resolved;  // "" is "/"
  int links = 0;
  while (!rest.empty()) {
    const std::string part = std::move(rest.front());
    rest.pop_front();
    if (part == "..") {
      resolved.erase(resolved.empty() ? 0 : resolved.rfind('/'));
      continue;
    }
    const std::string next = resolved + "/" + part;
    struct stat info {};
    if (lstat(next.c_str(), &info) != 0) return std::nullopt;
    if (!S_ISLNK(info.st_mode)) {
      if (!rest.empty() && !S_ISDIR(info.st_mode)) {
        errno = ENOTDIR;
        return std::nullopt;
      }
      resolved = next;
      continue;
    }
    if (info.st_uid != 0 && info.st_uid != geteuid())
      fail_at(where,
              next + " is a symlink owned by uid " + std::to_string(info.st_uid) +
                  ", which a sandbox may have planted; a bind source follows only links "
                  "owned by root or by the runtime's user: bind the path it points to instead");
    // A link is only as trustworthy as whoever may put one where it is: another user who may
    // write its directory could have moved in a link root owns (one a root owner's sandbox made
    // in a directory it opened to everyone, say). Group-writable is fine for root's group and
    // the runtime's own (a user's private group).
    const std::string holder_path = resolved.empty() ? "/" : resolved;
    struct stat holder {};
    if (lstat(holder_path.c_str(), &holder) != 0) return std::nullopt;
    const bool others_write =
        (holder.st_mode & S_IWOTH) ||
        ((holder.st_mode & S_IWGRP) && holder.st_gid != 0 && holder.st_gid != getegid());
    if ((holder.st_uid != 0 && holder.st_uid != geteuid()) || others_write)
      fail_at(where, next + " is a symlink in " + holder_path + ", a directory " +
                         (others_write ? std::string("others may write")
                                       : "of uid " + std::to_string(holder.st_uid)) +
                         ", who could have put it there; a bind source follows links only in "
                         "directories no one but root or the runtime's user may write: bind the "
                         "path it points to instead");
    // Root's links too, beneath a directory a root owner's sandbox wrote (written_mark.hpp).
    if (const auto marked = sandbox_written_ancestor(holder_path))
      fail_at(where, next + " is a symlink in " + *marked + ", which a sandbox wrote (it carries " +
                         kWrittenMarkName +
                         "); a bind source follows no link a sandbox may have planted: bind the "
                         "path it points to instead (or, once you trust what is there, remove "
                         "the mark: setfattr -x " +
                         kWrittenMarkName + " " + *marked + ")");
    if (++links > kMaxLinks) {
      errno = ELOOP;
      return std::nullopt;
    }
    char contents[PATH_MAX];
    const ssize_t length = readlink(next.c_str(), contents, sizeof contents);
    if (length < 0) return std::nullopt;
    if (length == static_cast<ssize_t>(sizeof contents)) {
      errno = ENAMETOOLONG;
      return std::nullopt;
    }
    const std::string target(contents, static_cast<std::size_t>(length));
    if (!target.empty() && target[0] == '/') resolved.clear();
    push_front(target);
  }
  return resolved.empty() ? "/" : resolved;
}

}  // namespace rlm::ns
