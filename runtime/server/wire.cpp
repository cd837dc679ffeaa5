#include "server/wire.hpp"

#include <malloc.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "rlm_sys/sys.hpp"
#include "session/frame_decoder.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

constexpr std::size_t kHeader = 4;

// Waits for `events` on `socket` until `deadline`; true when they came (or an error or hangup).
bool wait_for(int socket, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{socket, events, 0};
    const int ready = poll(&entry, 1, sys::poll_timeout_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) return false;
  }
}

// One sendmsg of `data` (fds attached when given); the bytes sent, or -1 with errno.
ssize_t send_some(int socket, std::string_view data, std::span<const int> fds) {
  if (fds.size() > kMaxFrameFds) throw WireError("too many fds for one frame");
  return sys::send_with_fds(socket, data, fds, MSG_DONTWAIT);
}

// A frame larger than this is received into a mapping of its own, and the heap its parsed value
// took is given back to the system when it is done.
constexpr std::uint32_t kLargeFrame = 1u << 20;

// A frame's body, received in place and never initialised. A large one is an anonymous mapping
// of the announced length: only the pages bytes arrived in become resident (a peer announcing a
// large frame and sending nothing costs nothing), and munmap gives every one back. (A heap buffer
// grown as bytes came held up to twice what had arrived, and its thread's arena kept it after it
// was freed: stalled large frames left the server hundreds of MiB larger.)
class FrameBody {
 public:
  explicit FrameBody(std::size_t length) : length_(length) {
    if (length <= kLargeFrame) {
      heap_ = std::make_unique_for_overwrite<char[]>(length);
      return;
    }
    void* mapped =
        mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED)
      throw WireError("no memory for a frame of " + std::to_string(length) + " bytes");
    mapped_ = static_cast<char*>(mapped);
  }
  ~FrameBody() {
    if (mapped_) munmap(mapped_, length_);
  }
  FrameBody(const FrameBody&) = delete;
  FrameBody& operator=(const FrameBody&) = delete;
  char* data() { return mapped_ ? mapped_ : heap_.get(); }

 private:
  std::size_t length_;
  char* mapped_ = nullptr;
  std::unique_ptr<char[]> heap_;
};

// After a large frame: what parsing it took from the heap goes back to the system, not kept by
// the thread's arena.
struct TrimAfter {
  bool large;
  ~TrimAfter() {
#ifdef __GLIBC__
    if (large) malloc_trim(0);
#endif
  }
};

std::uint32_t frame_length(const char* header) {
  const auto byte = [&](int i) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(header[i]));
  };
  return byte(0) << 24 | byte(1) << 16 | byte(2) << 8 | byte(3);
}

}  // namespace

std::string encode_frame(const json& message) {
  std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  if (body.size() > 0xFFFFFFFFu) throw WireError("a frame over 4 GiB cannot be sent");
  const auto size = static_cast<std::uint32_t>(body.size());
  std::string frame(kHeader, '\0');
  frame[0] = static_cast<char>(size >> 24);
  frame[1] = static_cast<char>(size >> 16);
  frame[2] = static_cast<char>(size >> 8);
  frame[3] = static_cast<char>(size);
  return frame + body;
}

void send_frame(int socket, const json& message, Clock::time_point deadline,
                std::span<const int> fds) {
  send_encoded(socket, encode_frame(message), deadline, fds);
}

void send_encoded(int socket, std::string_view frame, Clock::time_point deadline,
                  std::span<const int> fds) {
  std::size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t count =
        send_some(socket, frame.substr(sent), sent == 0 ? fds : std::span<const int>{});
    if (count > 0) {
      sent += static_cast<std::size_t>(count);
      continue;
    }
    if (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw WireError("the connection broke while sending: " + sys::errno_text(errno));
    if (!wait_for(socket, POLLOUT, deadline))
      throw WireError("the peer did not read a frame in time");
  }
}

bool send_frame_now(int socket, const json& message) {
  const std::string frame = encode_frame(message);
  const ssize_t count = send_some(socket, frame, {});
  return count == static_cast<ssize_t>(frame.size());
}

bool wait_readable(int socket, Clock::time_point deadline) {
  return wait_for(socket, POLLIN, deadline);
}

FrameBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), uid_(other.uid_), bytes_(other.bytes_) {}

FrameBudget::Reservation& FrameBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_) budget_->release(uid_, bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    uid_ = other.uid_;
    bytes_ = other.bytes_;
  }
  return *this;
}

FrameBudget::Reservation::~Reservation() {
  if (budget_) budget_->release(uid_, bytes_);
}

FrameBudget::Reservation FrameBudget::reserve(uid_t uid, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  std::uint64_t& own = by_uid_[uid];
  if (own + bytes > per_uid_) {
    if (own == 0) by_uid_.erase(uid);
    throw FrameRefused("a frame of " + std::to_string(bytes) + " bytes would take uid " +
                       std::to_string(uid) + "'s frames in flight over its share of " +
                       std::to_string(per_uid_) +
                       " bytes (max_bytes_in_flight_per_uid, a budget per uid); the server "
                       "refuses it rather than wait: send it when your other frames are done");
  }
  if (in_flight_ + bytes > total_) {
    if (own == 0) by_uid_.erase(uid);
    throw FrameRefused("a frame of " + std::to_string(bytes) +
                       " bytes would take the frames in flight over the server's budget of " +
                       std::to_string(total_) + " bytes (max_bytes_in_flight); try again later");
  }
  own += bytes;
  in_flight_ += bytes;
  Reservation reservation;
  reservation.budget_ = this;
  reservation.uid_ = uid;
  reservation.bytes_ = bytes;
  return reservation;
}

void FrameBudget::release(uid_t uid, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  in_flight_ -= bytes;
  const auto own = by_uid_.find(uid);
  if (own != by_uid_.end() && (own->second -= bytes) == 0) by_uid_.erase(own);
}

std::optional<Frame> receive_frame(int socket, Clock::time_point first_byte_deadline,
                                   std::chrono::milliseconds frame_timeout, std::uint64_t max_bytes,
                                   FrameAccount account) {
  Frame frame;
  std::array<char, kHeader> header{};
  std::size_t have = 0;
  Clock::time_point deadline = first_byte_deadline;
  // The header: fds are taken only with its first bytes.
  while (have < kHeader) {
    std::array<int, kMaxFrameFds> fds{};
    const auto got =
        have == 0 ? sys::receive_with_fds(socket, std::span<char>(header.data(), kHeader), fds,
                                          MSG_DONTWAIT)
                  : sys::Received{recv(socket, header.data() + have, kHeader - have, MSG_DONTWAIT),
                                  errno, 0, false};
    for (std::size_t i = 0; i < got.fds; ++i) frame.fds.emplace_back(fds[i]);
    if (got.bytes > 0) {
      if (have == 0) deadline = Clock::now() + frame_timeout;
      have += static_cast<std::size_t>(got.bytes);
      continue;
    }
    if (got.bytes == 0) {
      if (have == 0) return std::nullopt;
      throw WireError("the connection ended inside a frame");
    }
    if (got.error != EAGAIN && got.error != EWOULDBLOCK && got.error != EINTR)
      throw WireError("the connection broke: " + sys::errno_text(got.error));
    if (!wait_for(socket, POLLIN, deadline))
      throw WireError(have == 0 ? "no request arrived in time" : "a frame did not arrive in time");
  }
  const std::uint32_t length = frame_length(header.data());
  if (length > max_bytes)
    throw WireError("a frame of " + std::to_string(length) + " bytes is over the limit of " +
                    std::to_string(max_bytes));
  // Destroyed last: after the body and the parse's temporaries are freed.
  const TrimAfter trim{length > kLargeFrame};
  FrameBudget::Reservation reservation;
  if (account.budget && length > kUnbudgetedFrameBytes)
    reservation = account.budget->reserve(account.uid, length);
  // Received straight into the body; no bounce buffer to clear for every small frame.
  FrameBody body(length);
  for (std::size_t received = 0; received < length;) {
    const ssize_t count = recv(socket, body.data() + received, length - received, MSG_DONTWAIT);
    const int error = errno;
    if (count > 0) {
      received += static_cast<std::size_t>(count);
      continue;
    }
    if (count == 0) throw WireError("the connection ended inside a frame");
    if (error != EAGAIN && error != EWOULDBLOCK && error != EINTR)
      throw WireError("the connection broke: " + sys::errno_text(error));
    if (!wait_for(socket, POLLIN, deadline)) throw WireError("a frame did not arrive in time");
  }
  try {
    frame.message = session::parse_frame_body(std::string_view(body.data(), length));
  } catch (const Error& error) {
    throw WireError(error.what());
  }
  const auto op = frame.message.find("op");
  if (op == frame.message.end() || !op->is_string())
    throw WireError("a frame without a string \"op\"");
  return frame;
}

bool SharedSender::send(const json& message, std::span<const int> fds) {
  std::lock_guard lock(mutex_);
  if (socket_ < 0) return false;
  try {
    send_frame(socket_, message, Clock::now() + timeout_, fds);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void SharedSender::detach() {
  std::lock_guard lock(mutex_);
  socket_ = -1;
}

json error_frame(std::string_view kind, const std::string& message,
                 const std::vector<Diagnostic>& diagnostics) {
  json frame{{"op", "error"}, {"kind", kind}, {"message", message}};
  if (!diagnostics.empty()) {
    json list = json::array();
    for (const auto& d : diagnostics) list.push_back({{"path", d.path}, {"message", d.message}});
    frame["diagnostics"] = std::move(list);
  }
  return frame;
}

}  // namespace rlm::server
