// Who is on the other end of a connection: the kernel's SO_PEERCRED (taken at connect time, so a
// client cannot change it afterwards) and SO_PEERGROUPS, checked against the server's allow list
// before anything the peer sent is read.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlm::server {

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups
  // A TLS client's: the certificate identity that named its uid (pid is then 0), and its address
  // ("HOST:PORT"); "" for a unix socket's peer.
  std::string identity;
  std::string remote;
  // A TLS client's connection, numbered by the server (0: a unix socket's peer): a revocation ends
  // what that connection started (Activities::kill_connection).
  std::uint64_t connection = 0;
};

// The kernel's SO_PEERCRED of a connected unix socket (pid, uid, gid at connect or listen time);
// nullopt with errno set when it cannot tell. The server's check of its clients and a client's
// check of whoever listens (client_wire.cpp) both read it here.
std::optional<ucred> peer_credentials(int socket);

// The peer of a connected unix socket; nullopt when the kernel cannot tell.
std::optional<Peer> peer_of(int socket);
// Its uid only (one getsockopt): what the accept loop counts connections by.
std::optional<uid_t> peer_uid(int socket);

// Whether `peer` may use the server: it runs as the server's own uid, or its uid is in
// `allow_uids`, or its primary or a supplementary group is in `allow_gids`.
bool peer_allowed(const Peer& peer, uid_t server_uid, const std::vector<uid_t>& allow_uids,
                  const std::vector<gid_t>& allow_gids);

// "uid 65534 (gid 65534)" for messages.
std::string describe(const Peer& peer);

}  // namespace rlm::server
