// How a session's worker proves itself, and how it is reached where no fd can be passed into the
// sandbox (Docker): the session token, and the rendezvous, a private directory holding a listening
// socket (and the context as a file), bind-mounted into the sandbox. The worker connects, and the
// first connection that says hello with the session token becomes the channel.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "session/channel.hpp"

namespace rlm::session {

// 16 random bytes in hex, made per session; the worker's hello must carry it.
std::string random_token();
// Compares in constant time: the comparison does not stop at the first miss.
bool same_token(const std::string& a, const std::string& b);

class Rendezvous {
 public:
  static constexpr const char* kInside = "/run/rlm-sandbox";

  // Makes the directory (in /tmp) and its socket. Throws Error.
  explicit Rendezvous(const SessionOptions& options);
  ~Rendezvous();  // removes the directory
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // The bind mount that puts the directory at kInside in the sandbox.
  Mount mount() const;
  std::string socket_inside() const { return std::string(kInside) + "/channel.sock"; }

  // Accepts until a connection's first frame is the hello with `token`, which it returns, and
  // makes that connection `channel`; the listener is closed then. nullopt at `deadline` or once
  // `done_fd` (the end of the run) is readable.
  std::optional<nlohmann::json> accept_hello(const std::string& token, int done_fd,
                                             std::chrono::steady_clock::time_point deadline,
                                             Channel& channel);

 private:
  std::string dir_;
  host::UniqueFd listener_;
  std::uint64_t max_frame_;
};

}  // namespace rlm::session
