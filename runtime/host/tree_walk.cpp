#include "host/tree_walk.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace rlm::host {

bool walk_tree(int top_fd, const TreeLimits& limits,
               const std::function<bool(const TreeEntry& entry)>& visit) {
  struct stat st {};
  if (fstat(top_fd, &st) != 0) return false;
  const std::string top_path;
  if (!visit({top_fd, "", st, top_path})) return false;
  if (!S_ISDIR(st.st_mode)) return true;

  struct Level {
    DIR* dir;
    std::string path;  // relative to the top, "" for the top itself
  };
  std::vector<Level> stack;
  const auto push = [&](int parent_fd, const char* name, std::string path) {
    const int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    DIR* dir = fdopendir(fd);
    if (!dir) {
      close(fd);
      return false;
    }
    stack.push_back({dir, std::move(path)});
    return true;
  };
  if (!push(top_fd, ".", "")) return false;
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
    if (fstatat(dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) complete = false;  // gone meanwhile: nothing of it left
      continue;
    }
    const std::string& parent = stack.back().path;
    std::string path = parent.empty() ? entry->d_name : parent + "/" + entry->d_name;
    if (!visit({dirfd(dir), entry->d_name, st, path})) {
      complete = false;
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      if (stack.size() >= limits.max_depth || !push(dirfd(dir), entry->d_name, std::move(path))) {
        complete = false;
        break;
      }
    }
  }
  for (auto& level : stack) closedir(level.dir);
  return complete;
}

}  // namespace rlm::host
