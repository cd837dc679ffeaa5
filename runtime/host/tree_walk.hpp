// A directory tree on the host that a sandbox wrote, walked as hostile: no link is followed (each
// directory is opened beneath its parent, each entry through an O_PATH descriptor of exactly the
// inode that was checked), and the walk is bounded in entries and depth.
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

// Calls `visit(fd, st, path)` for the inode at `top_fd` (path "") and for every entry beneath it
// (path relative to it, "a/b"), fd an O_PATH descriptor of the entry. `visit` returns false to
// stop. True when every entry was visited and none stopped the walk; false when one stopped it,
// when a directory could not be read, or at a bound.
bool walk_tree(
    int top_fd, const TreeLimits& limits,
    const std::function<bool(int fd, const struct stat& st, const std::string& path)>& visit);

}  // namespace rlm::host
