// The server's side of a TLS client (docs/fleet.md, "The wire over TLS"): once the client's
// certificate has named a uid, its frames go to the same ops as a unix client's, over a socket
// pair, with pipes and memfds made here where the unix client would pass fds; the streams the
// client sends are written into them, and what the payload writes is read out and sent back in
// order, within the run's output cap, before the answer that ends the op.
#pragma once

#include <chrono>
#include <cstdint>

#include "host/unique_fd.hpp"
#include "server/remote_wire.hpp"
#include "server/tls.hpp"
#include "server/wire.hpp"

namespace rlm::server {

struct GatewayLimits {
  std::uint64_t max_frame_bytes;            // one client frame, as on the unix socket
  std::chrono::milliseconds frame_timeout;  // a frame begun must end; a write must be taken
  std::uint64_t max_file_bytes;             // a file_in stream (a save file to load)
  FrameAccount account;                     // the client's frames count in the server's budget
};

// Relays between `tls` and `ops` (the socket the ops serve) until either side ends; a client that
// breaks this protocol is sent an error frame and dropped. Never throws.
void relay_tls_client(TlsStream& tls, host::UniqueFd ops, const GatewayLimits& limits);

}  // namespace rlm::server
