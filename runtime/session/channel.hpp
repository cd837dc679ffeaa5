// One end of a control channel to a sandboxed interpreter: frames of a 4-byte big-endian length
// plus a JSON object (docs/control-channel.md), fds received with SCM_RIGHTS. Nonblocking; the
// session's poll loop drives it. Nothing received is ever evaluated: it is parsed as JSON.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/unique_fd.hpp"

namespace rlm::session {

class Channel {
 public:
  Channel() = default;
  Channel(common::UniqueFd fd, std::uint64_t max_frame);

  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  // Also drops fds received and not taken: a standby's channel announced in an unread fork frame
  // must close too, or that standby never sees EOF.
  void close() {
    fd_.reset();
    fds_.clear();
    buffer_.clear();
    consumed_ = 0;
  }

  // Sends one frame (blocking until written: frames to the sandbox are small, and the peer reads
  // them promptly). Returns false when the peer is gone.
  bool send(const nlohmann::json& message);

  // Reads what is there without blocking. Returns false at EOF or on a read error.
  bool receive();
  // The next complete frame, if one has arrived. Throws Error for a frame over the cap or one
  // that is not a JSON object: the caller ends the session.
  std::optional<nlohmann::json> next_frame();
  // The oldest fd received and not yet taken (a `fork` frame's), or an empty one.
  common::UniqueFd take_fd();

 private:
  common::UniqueFd fd_;
  std::uint64_t max_frame_ = 16u << 20;
  std::string buffer_;
  std::size_t consumed_ = 0;
  std::deque<common::UniqueFd> fds_;
};

}  // namespace rlm::session
