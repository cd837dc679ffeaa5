// The server's side of a TLS client (docs/fleet.md, "The wire over TLS"): once the client's
// certificate has named a uid, its frames go to the same ops as a unix client's, over a socket
// pair, with pipes and memfds made here where the unix client would pass fds; the streams the
// client sends are written into them, and what the payload writes is read out and sent back in
// order, within the run's output cap, before the answer that ends the op. One TLS connection may
// carry op after op, each in a connection of its own to the ops.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

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
  // Asked about once a second while the connection lasts (a kept one between ops included):
  // why its client may no longer be served (its certificate revoked by a list loaded since), or
  // "". The connection is then cut with that error, ending its op. Unset: never asked.
  std::function<std::string()> withdrawn;
};

// What `open_ops` throws when the server will not take the connection's next op (its uid's share
// of connections is used up, the server stops): sent to the client as an error frame.
struct Refused : Error {
  Refused(std::string kind, const std::string& message) : Error(message), kind(std::move(kind)) {}
  std::string kind;
};

// Relays between `tls` and the ops until the client leaves, breaks this protocol (it is sent an
// error frame and dropped), is withdrawn (`limits.withdrawn`) or idles 30 s between ops. Each op --
// a run, a session, a status... -- gets a connection of its own to the ops from `open_ops` (the
// socket's far end is served as a unix client's is); when the ops close it, the client is told
// {"op":"idle"} and may send its next op on the same TLS connection. Never throws.
void relay_tls_client(TlsStream& tls, const std::function<host::UniqueFd()>& open_ops,
                      const GatewayLimits& limits);

}  // namespace rlm::server
