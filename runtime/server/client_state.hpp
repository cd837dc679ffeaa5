// ServerConnection's state, shared by its files (client.cpp, client_run.cpp, client_session.cpp).
#pragma once

#include <memory>
#include <string>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/client_wire.hpp"

namespace rlm {

struct ServerConnection::State {
  std::string path;
  host::UniqueFd socket;
};

namespace server {

// The session relayed over `socket` (already opened: session_opened received).
// `node`: the node that holds it (session_opened's "node"; "" from a server that does not say).
std::unique_ptr<Session> make_relayed_session(host::UniqueFd socket, SessionOptions options,
                                              std::string node = {});

}  // namespace server
}  // namespace rlm
