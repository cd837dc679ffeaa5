#include "session/channel.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::session {
namespace {

constexpr std::size_t kChunk = 256 * 1024;
// Reads per receive() call: a sandbox sending one byte per message (each with fds attached) gets
// as many syscalls as it sends messages, but never holds the caller in one call.
constexpr int kMaxReads = 256;
constexpr int kMaxIovecs = 16;
// Fds kept for frames received and not taken yet. One receive() call may read a hundred frames
// before the caller takes any; the protocol never has more than two fork frames waiting on one
// channel (a superseded one and its replacement), so an fd beyond these is closed on arrival (and
// its frame carries none).
constexpr std::size_t kMaxHeldFds = 4;

}  // namespace

Channel::Channel(host::UniqueFd fd, std::uint64_t max_frame)
    : fd_(std::move(fd)), decoder_(max_frame) {
  const int flags = fcntl(fd_.get(), F_GETFL);
  if (flags >= 0) fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK);
}

void Channel::close() {
  fd_.reset();
  decoder_ = FrameDecoder(0);
  frame_fds_.clear();
  frame_fd_.reset();
  outbound_.clear();
  outbound_offset_ = 0;
  unsent_ = 0;
}

bool Channel::send(const nlohmann::json& message) {
  return send(message, -1);
}

bool Channel::send(const nlohmann::json& message, int fd) {
  if (!fd_ || (fd >= 0 && !outbound_.empty())) return false;
  auto [header, body] = encode_frame(message);
  const auto length = static_cast<std::uint32_t>(body.size());
  std::size_t offset = 0;
  if (fd >= 0) {
    // The header's first byte goes with the fd. It is 0: the hand-over frame is small, far
    // below 16 MiB. A socket that takes nothing now is refused (nothing is queued before the
    // hand-over, so its buffer is empty).
    if (length >> 24 != 0 || sys::send_fd(fd_.get(), fd) != 0) return false;
    offset = 1;
  }
  unsent_ += header.size() - offset + body.size();
  if (offset < header.size()) outbound_.push_back(header.substr(offset));
  outbound_.push_back(std::move(body));
  return flush();
}

void Channel::set_max_frame(std::uint64_t max_frame) {
  if (decoder_.buffered() != 0 || !frame_fds_.empty())
    throw Error("the frame limit can only change between frames");
  decoder_ = FrameDecoder(max_frame);  // counts frames from 0 again: no fd is held for one
}

bool Channel::flush() {
  if (!fd_) return false;
  while (!outbound_.empty()) {
    iovec parts[kMaxIovecs];
    int count = 0;
    for (auto it = outbound_.begin(); it != outbound_.end() && count < kMaxIovecs; ++it, ++count) {
      const std::size_t skip = count == 0 ? outbound_offset_ : 0;
      parts[count] = {it->data() + skip, it->size() - skip};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<std::size_t>(count);
    const ssize_t sent = sendmsg(fd_.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK;  // else EPIPE: the peer is gone
    auto left = static_cast<std::size_t>(sent);
    unsent_ -= left;
    while (left > 0) {
      const std::size_t rest = outbound_.front().size() - outbound_offset_;
      if (left < rest) {
        outbound_offset_ += left;
        break;
      }
      left -= rest;
      outbound_.pop_front();
      outbound_offset_ = 0;
    }
  }
  return true;
}

bool Channel::receive(std::size_t limit) {
  if (!fd_) return false;
  if (!chunk_) chunk_ = std::make_unique_for_overwrite<char[]>(kChunk);
  std::size_t received = 0;
  for (int reads = 0; reads < kMaxReads && received < limit;) {
    const std::size_t want = std::min({decoder_.want(), kChunk, limit - received});
    if (want == 0) return true;  // a broken stream: next_frame() says why
    const bool at_start = decoder_.at_frame_start();
    const std::uint64_t frame = decoder_.frames_started() - (at_start ? 0 : 1);
    // Room for exactly one fd: a message with more comes back truncated, the kernel (or
    // receive_with_fds) closing the rest.
    int fd = -1;
    const auto got = sys::receive_with_fds(fd_.get(), std::span<char>(chunk_.get(), want),
                                           std::span<int>(&fd, 1), MSG_DONTWAIT);
    if (got.bytes < 0) return got.error == EAGAIN || got.error == EWOULDBLOCK;
    ++reads;
    host::UniqueFd received_fd(got.fds == 1 ? fd : -1);  // closed unless kept below
    if (got.bytes == 0) return false;
    if (received_fd) {
      // Kept only as the one fd of a frame that it arrived on the first byte of; any fd on a
      // later byte of that frame makes the frame carry none.
      if (at_start && !got.truncated && frame_fds_.size() < kMaxHeldFds) {
        frame_fds_.emplace_back(frame, std::move(received_fd));
      } else if (!frame_fds_.empty() && frame_fds_.back().first == frame) {
        frame_fds_.pop_back();
      }
    }
    decoder_.append(chunk_.get(), static_cast<std::size_t>(got.bytes));
    received += static_cast<std::size_t>(got.bytes);
  }
  return true;
}

void Channel::settle_fds(std::uint64_t frame) {
  frame_fd_.reset();
  while (!frame_fds_.empty() && frame_fds_.front().first < frame) frame_fds_.pop_front();
  if (!frame_fds_.empty() && frame_fds_.front().first == frame) {
    frame_fd_ = std::move(frame_fds_.front().second);
    frame_fds_.pop_front();
  }
}

std::optional<nlohmann::json> Channel::next_frame() {
  const std::uint64_t frame = decoder_.frames_taken();
  std::optional<nlohmann::json> next;
  try {
    next = decoder_.next();
  } catch (...) {
    settle_fds(frame);
    frame_fd_.reset();
    throw;
  }
  if (next) settle_fds(frame);
  return next;
}

}  // namespace rlm::session
