#include "namespace/written_mark.hpp"

#include <sys/xattr.h>

#include <cerrno>

#include "namespace/mounts.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {

void mark_sandbox_written(int dir_fd, const std::string& host_path, const std::string& where) {
  char value[8];
  if (fgetxattr(dir_fd, kWrittenMarkName, value, sizeof value) >= 0) return;
  // The value says nothing; the name is the mark. "1" so that getfattr shows it plainly.
  if (fsetxattr(dir_fd, kWrittenMarkName, "1", 1, 0) == 0) return;
  const int error = errno;
  fail_at(
      where,
      "cannot mark " + host_path + " as written by a sandbox (" + sys::errno_text(error) +
          (error == ENOTSUP || error == EOPNOTSUPP ? ": its filesystem keeps no trusted attributes"
                                                   : "") +
          "); without the mark a link the sandbox planted there would be root's and "
          "followed like root's own, so it does not run. To fix: bind a directory on "
          "a filesystem with extended attributes (ext4, xfs, btrfs, tmpfs), bind it "
          "read-only, or run rlm-sandbox as a user other than root");
}

std::optional<std::string> sandbox_written_ancestor(const std::string& path) {
  std::string dir = path.empty() ? "/" : path;
  for (;;) {
    char value[8];
    if (lgetxattr(dir.c_str(), kWrittenMarkName, value, sizeof value) >= 0) return dir;
    if (dir == "/") return std::nullopt;
    const auto slash = dir.rfind('/');
    dir.erase(slash == 0 ? 1 : slash);
  }
}

}  // namespace rlm::ns
