#include "server/peer.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace rlm::server {

std::optional<ucred> peer_credentials(int socket) {
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return std::nullopt;
  if (size != sizeof credentials) {
    errno = EPROTO;
    return std::nullopt;
  }
  return credentials;
}

std::optional<Peer> peer_of(int socket) {
  const auto credentials = peer_credentials(socket);
  if (!credentials) return std::nullopt;
  Peer peer{credentials->pid, credentials->uid, credentials->gid, {}, {}, {}};
  // The supplementary groups: at most NGROUPS_MAX (65536); asked with room for 64 first.
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(socket, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno != ERANGE || bytes / sizeof(gid_t) > 65536) break;
    groups.resize(bytes / sizeof(gid_t));
  }
  return peer;  // without supplementary groups: only the uid and primary gid count
}

std::optional<uid_t> peer_uid(int socket) {
  const auto credentials = peer_credentials(socket);
  if (!credentials) return std::nullopt;
  return credentials->uid;
}

bool peer_allowed(const Peer& peer, uid_t server_uid, const std::vector<uid_t>& allow_uids,
                  const std::vector<gid_t>& allow_gids) {
  const auto listed = [](const auto& list, auto id) {
    return std::find(list.begin(), list.end(), id) != list.end();
  };
  if (peer.uid == server_uid || listed(allow_uids, peer.uid)) return true;
  if (listed(allow_gids, peer.gid)) return true;
  return std::any_of(peer.groups.begin(), peer.groups.end(),
                     [&](gid_t group) { return listed(allow_gids, group); });
}

std::string describe(const Peer& peer) {
  if (!peer.identity.empty())
    return "uid " + std::to_string(peer.uid) + " (gid " + std::to_string(peer.gid) +
           ", TLS identity '" + peer.identity + "')";
  return "uid " + std::to_string(peer.uid) + " (gid " + std::to_string(peer.gid) + ", pid " +
         std::to_string(peer.pid) + ")";
}

}  // namespace rlm::server
