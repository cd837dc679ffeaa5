// The bytes of one allowed connection, relayed both ways between the sandbox's socket and the
// upstream's through a buffer per direction, each direction's end passed on as a half-close. The
// sandbox's side is hostile: every wait is bounded by the idle limit and ends when `stop_fd` turns
// readable.
#pragma once

#include <chrono>
#include <cstdint>

#include "egress/client_gate.hpp"

namespace rlm::egress {

enum class RelayEnd {
  closed,   // both directions ended
  idle,     // nothing moved for the idle limit
  stopped,  // stop_fd: the sandbox is going away
  failed,   // a socket error (a reset) on either side
  refused,  // the gate refused the sandbox's bytes (it recorded why)
  limit,    // the connection carried its limit of bytes
};

struct RelayCount {
  std::uint64_t out = 0, in = 0;  // sandbox -> upstream, upstream -> sandbox
};

// Makes poll() on `fd` report it readable only once more than `bytes` wait (or at its end), so
// code that peeks and needs more does not spin on what it has seen (SO_RCVLOWAT); 0 undoes it.
void wake_beyond(int fd, std::size_t bytes);

// Both sockets non-blocking. `gate`, when set, judges the sandbox's bytes before they go
// (client_gate.hpp); bytes it has not admitted yet stay in the socket, read by peeking. Once it
// passes everything (a TLS handshake gone encrypted) they are read as they come.
// Ends (limit) once `count` holds more than `max_bytes` both ways together: a buffer's worth (1
// MiB) at most past it.
RelayEnd relay(int client, int upstream, int stop_fd, std::chrono::milliseconds idle,
               ClientGate* gate, RelayCount& count, std::uint64_t max_bytes);

}  // namespace rlm::egress
