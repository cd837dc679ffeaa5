// Who may connect to the server's socket file: connecting to a unix socket needs write permission
// on it, so a server that allows uid 1000 (--allow-uid) but keeps its socket root:root 0660 locks
// that uid out before the server ever sees it. The allowed uids and gids are granted the socket
// file itself through a POSIX ACL (user:UID:rw, group:GID:rw), leaving everyone else to the mode.
// Peers are checked against the allow lists all the same (admission.cpp): the file's permissions
// are the outer wall, the peer check the inner one.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace rlm::server {

// Grants `uids` and `gids` read-write access to the socket file at `path` (whose mode is `mode`)
// with an access ACL; nothing to do when there are none, or the mode lets everyone connect.
// Throws Error with the fix where the filesystem keeps no ACLs, or the attribute cannot be set.
void grant_socket_access(const std::string& path, mode_t mode, const std::vector<uid_t>& uids,
                         const std::vector<gid_t>& gids);

}  // namespace rlm::server
