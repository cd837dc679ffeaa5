// The client's side of a TLS server (docs/fleet.md, "The wire over TLS"): the client's code gets
// one end of a socket pair and speaks the unix protocol on it, fds and all; a thread relays it to
// the server over TLS, turning each fd into a stream (reading what the client's code gives, writing
// what the server sends) and back. So a run, a session, the node ops and a fleet's placement work
// the same through `tls://HOST:PORT` as through a socket path.
#pragma once

#include <string>
#include <string_view>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/wire.hpp"

namespace rlm::server {

// "tls://HOST:PORT" (or "[V6]:PORT"); false for a socket path.
bool is_tls_endpoint(std::string_view endpoint);

// Connects to the TLS server at `endpoint`, checks its certificate against `files.ca` and for the
// host it names, presents `files.cert`, and returns the socket the client's code talks on. Throws
// ServerRefused ("unavailable") saying what failed: the address, the handshake, the files.
host::UniqueFd connect_tls(const std::string& endpoint, const TlsFiles& files,
                           Clock::time_point deadline);

}  // namespace rlm::server
