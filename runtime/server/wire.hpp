// The server protocol's framing (docs/pools-and-server.md): a 4-byte big-endian length, then that
// many bytes of one JSON object; fds travel as SCM_RIGHTS on the frame's first bytes (sent with
// the header in one sendmsg). Both ends use it; every wait has a deadline, every read a bound, and
// what arrives is parsed with the control channel's bounded parser (depth, values), never
// recursing on the peer's data.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::server {

using Clock = std::chrono::steady_clock;

inline constexpr int kProtocolVersion = 1;
inline constexpr std::size_t kMaxFrameFds = 4;  // room for fds on one frame; more are closed

// The peer broke the protocol or the connection: a wrong frame, an overrun deadline, EOF inside a
// frame. The connection is over.
class WireError : public Error {
 public:
  using Error::Error;
};

// A frame the server will not take now: its bytes do not fit the budget of frames in flight
// (FrameBudget). The connection is over; the client is told "unavailable".
class FrameRefused : public WireError {
 public:
  using WireError::WireError;
};

// A frame this small is received without a reservation from a FrameBudget: one per connection at
// most (4 MiB for 64 connections), so a flood of large frames never refuses a hello.
inline constexpr std::uint64_t kUnbudgetedFrameBytes = 64u << 10;

// The bytes of frames being received on all of a server's connections, and on each uid's: a
// frame's announced length is reserved when its header arrives and given back once it is parsed
// (or fails). A reservation that does not fit is refused at once, never waited for.
class FrameBudget {
 public:
  FrameBudget(std::uint64_t total, std::uint64_t per_uid) : total_(total), per_uid_(per_uid) {}
  FrameBudget(const FrameBudget&) = delete;
  FrameBudget& operator=(const FrameBudget&) = delete;

  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

   private:
    friend class FrameBudget;
    FrameBudget* budget_ = nullptr;
    uid_t uid_ = 0;
    std::uint64_t bytes_ = 0;
  };
  // Throws FrameRefused, naming the budget (the server's, or the uid's share), when `bytes` more
  // do not fit.
  Reservation reserve(uid_t uid, std::uint64_t bytes);

 private:
  void release(uid_t uid, std::uint64_t bytes);
  std::mutex mutex_;
  const std::uint64_t total_, per_uid_;
  std::uint64_t in_flight_ = 0;
  std::map<uid_t, std::uint64_t> by_uid_;
};

// Whose frames a receive counts against which budget.
struct FrameAccount {
  FrameBudget* budget = nullptr;
  uid_t uid = 0;
};

struct Frame {
  nlohmann::json message;           // an object
  std::vector<host::UniqueFd> fds;  // those that came on its first byte
};

// One frame's bytes: the 4-byte big-endian length, then the message as compact JSON (keys in
// order, invalid UTF-8 replaced by U+FFFD). Throws WireError past 4 GiB. The golden corpus
// (tests/golden/) checks it byte for byte.
std::string encode_frame(const nlohmann::json& message);

// Sends one frame with `fds` attached, waiting at most until `deadline` for room. Throws
// WireError when the peer is gone or does not read in time.
void send_frame(int socket, const nlohmann::json& message, Clock::time_point deadline,
                std::span<const int> fds = {});
// The same for a frame already encoded (its header and body), passed on as it came.
void send_encoded(int socket, std::string_view frame, Clock::time_point deadline,
                  std::span<const int> fds = {});
// The same, never waiting: for a refusal sent on the way to closing. False when it did not fit.
bool send_frame_now(int socket, const nlohmann::json& message);

// Reads one frame, waiting until `first_byte_deadline` for it to begin and `frame_timeout` more
// for it to end. nullopt on EOF before a frame begins. Throws WireError for a frame over
// `max_bytes`, not a JSON object, nested too deep, with too many values, a deadline passed, or
// EOF inside a frame; FrameRefused for one over kUnbudgetedFrameBytes that does not fit
// `account`'s budget. The frame's "op" must be a string. Memory a large frame took is given back
// to the system once it is parsed.
std::optional<Frame> receive_frame(int socket, Clock::time_point first_byte_deadline,
                                   std::chrono::milliseconds frame_timeout, std::uint64_t max_bytes,
                                   FrameAccount account = {});

// Waits until `socket` has something to read (or EOF) or `deadline` passes; true when readable.
bool wait_readable(int socket, Clock::time_point deadline);

// One connection's sending side shared by threads (an LM answer may come from any): frames go
// whole, one at a time, each within `timeout`; once detached (the connection is over, its fd may
// be reused) nothing more is sent.
class SharedSender {
 public:
  SharedSender(int socket, std::chrono::milliseconds timeout)
      : socket_(socket), timeout_(timeout) {}
  // False when detached, or when the peer did not take the frame in time. `fds` go on the
  // frame's first byte.
  bool send(const nlohmann::json& message, std::span<const int> fds = {});
  void detach();

 private:
  std::mutex mutex_;
  int socket_;
  std::chrono::milliseconds timeout_;
};

// {"op":"error","kind":KIND,"message":MESSAGE[,"diagnostics":[{"path","message"}...]]}
nlohmann::json error_frame(std::string_view kind, const std::string& message,
                           const std::vector<Diagnostic>& diagnostics = {});

}  // namespace rlm::server
