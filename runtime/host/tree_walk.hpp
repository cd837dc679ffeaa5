// A directory tree on the host that a sandbox wrote, walked as hostile: no link is followed (each
// directory is opened beneath its parent with O_NOFOLLOW, each entry looked at with
// AT_SYMLINK_NOFOLLOW relative to the directory that holds it), and the walk is bounded in
// entries and depth.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <functional>
#include <string>

namespace rlm::host {

struct TreeLimits {
  std::size_t max_entries = 1'000'000;
  std::size_t max_depth = 256;
};

// One entry as the walk met it: `name` in the directory open at `dir_fd` ("" for the top itself,
// which `dir_fd` then is), its status as lstat gave it, its path relative to the top ("a/b").
struct TreeEntry {
  int dir_fd;
  const char* name;
  const struct stat& st;
  const std::string& path;
};

// Calls `visit` for the inode at `top_fd` and for every entry beneath it. `visit` returns false
// to stop. True when every entry was visited and none stopped the walk; false when one stopped
// it, when a directory could not be read, or at a bound.
bool walk_tree(int top_fd, const TreeLimits& limits,
               const std::function<bool(const TreeEntry& entry)>& visit);

}  // namespace rlm::host
