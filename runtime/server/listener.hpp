// The server's listening socket: bound under a temporary name beside the path, given its mode,
// then renamed over the path, so a client never meets a half-made socket. A file already at the
// path is replaced only when it is a socket nobody listens on (a server killed before it could
// remove it); anything else is left alone and the server does not start.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "host/unique_fd.hpp"

namespace rlm::server {

struct Listener {
  host::UniqueFd fd;
  std::string path;  // "" for an inherited socket (nothing to remove)
  ino_t inode = 0;   // the socket file's, so only our own file is removed
  dev_t device = 0;
};

// Throws Error saying why the socket cannot be made at `path`. `allow_uids` and `allow_gids` are
// granted the socket file beside its mode (socket_access.hpp) before it appears at `path`.
Listener listen_at(const std::string& path, mode_t mode, int backlog,
                   const std::vector<uid_t>& allow_uids = {},
                   const std::vector<gid_t>& allow_gids = {});

// An O_PATH fd of the socket file at `path` when it is one this process may take for its own: a
// socket (not a symlink to one), owned by this euid, with one link; else an empty fd. What the
// server changes on its socket file goes through it, never through the name, which another user
// may have swapped in a directory they can write.
host::UniqueFd open_own_socket_file(const std::string& path);

// Removes the socket file if it is still the one `listener` made.
void remove_socket_file(const Listener& listener);

}  // namespace rlm::server
