// The server's TCP listener for TLS clients (docs/fleet.md, "Remote access"): the socket, the
// check that a connection speaks TLS at all, and which uid a client certificate is.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "host/unique_fd.hpp"
#include "server/peer.hpp"
#include "server/tls.hpp"

namespace rlm::server {

struct TlsListener {
  host::UniqueFd fd;
  std::shared_ptr<TlsContext> context;
  std::string address;  // as bound: "127.0.0.1:7443" (the port chosen when 0 was asked for)
};

// Binds and listens on `host_port` ("HOST:PORT", "[V6]:PORT"; port 0 picks one) with the
// server's certificate, key and client CA loaded. Throws Error saying what is wrong.
TlsListener listen_tls(const std::string& host_port, const std::string& cert,
                       const std::string& key, const std::string& client_ca, int backlog);

// Whether the connection's first byte is a TLS handshake record (0x16), waiting until `deadline`
// for it; false for anything else (a plain-protocol client), EOF or silence.
bool speaks_tls(int socket, Clock::time_point deadline);

// The peer a client certificate's identities (`names`: its CN, then its SANs) stand for: the
// first one `identities` lists gives the uid (and that uid's primary group, when the host knows
// it). A string saying why not when none is listed, or two name different uids.
std::variant<Peer, std::string> peer_of_identities(const std::vector<std::string>& names,
                                                   const std::map<std::string, uid_t>& identities);

// "HOST:PORT" of a connected socket's far end, for the log.
std::string remote_address(int socket);

}  // namespace rlm::server
