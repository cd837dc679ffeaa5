#include "session/channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm::session {
namespace {

constexpr std::size_t kHeader = 4;
constexpr std::size_t kChunk = 64 * 1024;
constexpr int kMaxFdsPerMessage = 4;

}  // namespace

Channel::Channel(common::UniqueFd fd, std::uint64_t max_frame)
    : fd_(std::move(fd)), max_frame_(max_frame) {
  const int flags = fcntl(fd_.get(), F_GETFL);
  if (flags >= 0) fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK);
}

bool Channel::send(const nlohmann::json& message) {
  if (!fd_) return false;
  const std::string body = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string frame(kHeader, '\0');
  const auto length = static_cast<std::uint32_t>(body.size());
  for (std::size_t i = 0; i < kHeader; ++i)
    frame[i] = static_cast<char>((length >> (8 * (kHeader - 1 - i))) & 0xff);
  frame += body;
  std::size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t count = ::send(fd_.get(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (count > 0) {
      sent += static_cast<std::size_t>(count);
      continue;
    }
    if (count < 0 && errno == EINTR) continue;
    if (count < 0 && errno == EAGAIN) {
      pollfd writable{fd_.get(), POLLOUT, 0};
      if (poll(&writable, 1, 5'000) > 0) continue;
    }
    return false;  // EPIPE / ECONNRESET: the interpreter is gone; or it stopped reading
  }
  return true;
}

bool Channel::receive() {
  if (!fd_) return false;
  for (;;) {
    char data[kChunk];
    iovec io{data, sizeof data};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t count = recvmsg(fd_.get(), &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) return errno == EAGAIN;
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t fds = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < fds; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
        fds_.emplace_back(fd);
      }
    }
    if (count == 0) return false;
    buffer_.append(data, static_cast<std::size_t>(count));
    if (static_cast<std::size_t>(count) < sizeof data) return true;
  }
}

std::optional<nlohmann::json> Channel::next_frame() {
  const std::size_t available = buffer_.size() - consumed_;
  if (available < kHeader) return std::nullopt;
  std::uint32_t length = 0;
  for (std::size_t i = 0; i < kHeader; ++i)
    length = (length << 8) | static_cast<unsigned char>(buffer_[consumed_ + i]);
  if (length > max_frame_)
    throw Error("the sandbox sent a frame of " + format_size(length) + ", over the limit of " +
                format_size(max_frame_));
  if (available < kHeader + length) return std::nullopt;
  nlohmann::json frame = nlohmann::json::parse(buffer_.begin() + consumed_ + kHeader,
                                               buffer_.begin() + consumed_ + kHeader + length,
                                               nullptr, /*allow_exceptions=*/false);
  consumed_ += kHeader + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  } else if (consumed_ > kChunk) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  if (frame.is_discarded()) throw Error("the sandbox sent a frame that is not valid JSON");
  if (!frame.is_object()) throw Error("the sandbox sent a frame that is not a JSON object");
  return frame;
}

common::UniqueFd Channel::take_fd() {
  if (fds_.empty()) return {};
  auto fd = std::move(fds_.front());
  fds_.pop_front();
  return fd;
}

}  // namespace rlm::session
