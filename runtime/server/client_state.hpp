// ServerConnection's state, shared by its files (client.cpp, client_run.cpp, client_session.cpp).
#pragma once

#include <memory>
#include <string>

#include "common/unique_fd.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/client_wire.hpp"

namespace rlm {

struct ServerConnection::State {
  std::string path;
  common::UniqueFd socket;
};

namespace server {

// The session relayed over `socket` (already opened: session_opened received).
std::unique_ptr<Session> make_relayed_session(common::UniqueFd socket, SessionOptions options);

}  // namespace server
}  // namespace rlm
