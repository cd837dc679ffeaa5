// Await mode (rlm_init/protocol.hpp): init is ready before anyone has asked for a payload, and
// waits on a socket for the one message that says what to run. The message comes from the host,
// but it is read as defensively as anything else: every count, size and string is bounded and
// checked before use, and anything malformed starts nothing.
#pragma once

#include <string>
#include <vector>

#include "options.hpp"

namespace rlm::init {

// What one payload message carried; `options` points into it, so it must outlive them.
struct AwaitedPayload {
  std::vector<char> body;   // the strings, NUL-terminated
  std::vector<char*> argv;  // null-terminated, into `body`
  std::vector<char*> envp;  // null-terminated, into `body`
  std::vector<int> fds;     // received (close-on-exec): the stdio three first, if any
  ~AwaitedPayload();        // closes `fds`
};

// Waits on `socket` for the payload message, watching `signal_fd` (supervised_signals()) too: a
// SIGTERM before the whole message has arrived gives up. On success returns "" and fills
// `options` (payload argv and envp, workdir, limits, guard_signals, grace, stdio and inherited
// fds) from `payload`. Otherwise returns why nothing may start: the host closed the socket, a
// SIGTERM, or what is wrong with the message.
std::string await_payload(int socket, int signal_fd, Options& options, AwaitedPayload& payload);

// --hold-after-report: after the report, waits until the host closes `socket` (or it breaks), or
// a signal other than SIGCHLD arrives on `signal_fd`; whatever the host sends is discarded.
void hold_until_host_leaves(int socket, int signal_fd);

}  // namespace rlm::init
