#include "host/owned_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

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
                   const OwnedFilesLimits& limits) {
  UniqueFd top(open(root.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!top) return errno == ENOENT;  // nothing there: nothing of the uid's either
  struct stat st {};
  if (fstat(top.get(), &st) != 0 || !reclaim(top.get(), st, uid, gid, owner)) return false;
  if (!S_ISDIR(st.st_mode)) return true;

  struct Level {
    DIR* dir;
  };
  std::vector<Level> stack;
  const auto close_all = [&] {
    for (auto& level : stack) closedir(level.dir);
    stack.clear();
  };
  const auto push = [&](int path_fd) {
    const int fd = openat(path_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    DIR* dir = fdopendir(fd);
    if (!dir) {
      close(fd);
      return false;
    }
    stack.push_back({dir});
    return true;
  };
  if (!push(top.get())) return false;
  std::size_t entries = 0;
  bool complete = true;
  while (!stack.empty()) {
    DIR* dir = stack.back().dir;
    errno = 0;
    const dirent* entry = readdir(dir);
    if (!entry) {
      if (errno != 0) complete = false;
      closedir(dir);
      stack.pop_back();
      continue;
    }
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    if (++entries > limits.max_entries) {
      complete = false;
      break;
    }
    const UniqueFd fd(openat(dirfd(dir), entry->d_name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!fd || fstat(fd.get(), &st) != 0) {
      if (errno != ENOENT) complete = false;  // gone meanwhile: nothing of it left
      continue;
    }
    if (!reclaim(fd.get(), st, uid, gid, owner)) complete = false;
    if (S_ISDIR(st.st_mode)) {
      if (stack.size() >= limits.max_depth || !push(fd.get())) {
        complete = false;
        break;
      }
    }
  }
  close_all();
  return complete;
}

}  // namespace rlm::host
