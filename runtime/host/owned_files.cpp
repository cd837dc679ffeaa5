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
  const bool walked =
      walk_tree(top.get(), limits, [&](int fd, const struct stat& st, const std::string&) {
        if (!reclaim(fd, st, uid, gid, owner)) changed = false;
        return true;
      });
  return walked && changed;
}

}  // namespace rlm::host
