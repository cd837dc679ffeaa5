#include "host/owned_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/tree_walk.hpp"
#include "host/unique_fd.hpp"

namespace rlm::host {
namespace {

// Changes what of `fd`'s inode is (uid, gid)'s to `owner`'s; false when that fails.
bool reclaim(int fd, const struct stat& st, uid_t uid, gid_t gid, const HostIds& owner) {
  const bool by_uid = st.st_uid == uid;
  const bool by_gid = st.st_gid == gid;
  if (!by_uid && !by_gid) return true;
  return fchownat(fd, "", by_uid ? owner.uid : static_cast<uid_t>(-1),
                  by_gid ? owner.gid : static_cast<gid_t>(-1), AT_EMPTY_PATH) == 0;
}

}  // namespace

bool give_to_owner(const std::string& root, uid_t uid, gid_t gid, const HostIds& owner,
                   const TreeLimits& limits) {
  UniqueFd top(open(root.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!top) return errno == ENOENT;  // nothing there: nothing of the uid's either
  bool changed = true;
  const bool walked = walk_tree(top.get(), limits, [&](const TreeEntry& entry) {
    if (entry.st.st_uid != uid && entry.st.st_gid != gid) return true;
    // Changed through an O_PATH fd of exactly the inode that was looked at.
    UniqueFd fd(*entry.name ? openat(entry.dir_fd, entry.name, O_PATH | O_NOFOLLOW | O_CLOEXEC)
                            : fcntl(entry.dir_fd, F_DUPFD_CLOEXEC, 0));
    struct stat now {};
    if (!fd || fstat(fd.get(), &now) != 0 || now.st_ino != entry.st.st_ino ||
        now.st_dev != entry.st.st_dev || !reclaim(fd.get(), now, uid, gid, owner))
      changed = false;
    return true;
  });
  return walked && changed;
}

}  // namespace rlm::host
