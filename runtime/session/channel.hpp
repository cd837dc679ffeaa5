// One end of a control channel to a sandboxed interpreter: frames of a 4-byte big-endian length
// plus a JSON object (docs/control-channel.md), fds received with SCM_RIGHTS. Never blocks: reads
// are bounded per call and never cross a frame boundary, writes go to an outbound queue that the
// session's poll loop flushes. Nothing received is ever evaluated: it is parsed as JSON, bounded
// in size and depth (FrameDecoder).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "session/frame_decoder.hpp"

namespace rlm::session {

class Channel {
 public:
  // What one receive() call reads at most, so that a sandbox writing without pause cannot keep
  // the caller from its other work (deadlines included).
  static constexpr std::size_t kReadSlice = 1u << 20;

  Channel() = default;
  Channel(host::UniqueFd fd, std::uint64_t max_frame);

  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  // Also drops what was received and not taken (a standby's channel announced in an unread fork
  // frame must close too, or that standby never sees EOF) and what was not sent yet.
  void close();

  // Queues one frame and writes what the socket takes now, without blocking; the rest waits for
  // flush(). Returns false when the peer is gone.
  bool send(const nlohmann::json& message);
  // The same with `fd` attached (SCM_RIGHTS) to the frame's first byte: only the hand-over, on a
  // channel with nothing queued (else returns false).
  bool send(const nlohmann::json& message, int fd);
  // Writes queued bytes until the socket would block. Returns false when the peer is gone.
  bool flush();
  // Bytes queued and not yet written: poll for POLLOUT while there are some.
  std::uint64_t unsent() const { return unsent_; }

  // Reads what is there without blocking, at most `limit` bytes. Returns false at EOF or on a
  // read error. Received fds are kept only when exactly one arrives on a frame's first byte;
  // every other one is closed at once.
  bool receive(std::size_t limit = kReadSlice);
  // The next complete frame, if one has arrived. Throws Error for a frame over the cap, not a
  // JSON object, or nested too deep: the caller ends the session.
  std::optional<nlohmann::json> next_frame();
  // The fd that came on the first byte of the frame next_frame() returned last (a `fork`
  // frame's), or an empty one. Not taken, it is closed with the next frame.
  host::UniqueFd take_fd() { return std::move(frame_fd_); }

  // The largest frame taken from now on. Only between frames with nothing buffered (the
  // hand-over, right after hello); throws Error otherwise.
  void set_max_frame(std::uint64_t max_frame);

  // Bytes received and not yet taken as frames (the partial frame included).
  std::uint64_t unread() const { return decoder_.buffered(); }
  // The partial frame's bytes so far (a JSON frame's bulk frames before it included).
  std::size_t partial_bytes() const { return decoder_.partial_bytes(); }
  // How many bytes the current partial frame still needs to be read at least (0 when none is
  // partial or the stream is broken).
  std::size_t partial_wants() const { return decoder_.frame_wants(); }

 private:
  void settle_fds(std::uint64_t frame);

  host::UniqueFd fd_;
  FrameDecoder decoder_{16u << 20};
  // Fds that came each on a frame's first byte: (frame number, fd), oldest first.
  std::deque<std::pair<std::uint64_t, host::UniqueFd>> frame_fds_;
  host::UniqueFd frame_fd_;
  std::deque<std::string> outbound_;
  std::size_t outbound_offset_ = 0;  // into outbound_.front()
  std::uint64_t unsent_ = 0;
  std::unique_ptr<char[]> chunk_;  // what one read takes, on its way to the decoder
};

}  // namespace rlm::session
