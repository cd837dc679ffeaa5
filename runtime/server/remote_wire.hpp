// The protocol over TLS (docs/fleet.md, "The wire over TLS"): the unix socket's frames, with
// streams where the unix socket passes fds. A frame that would carry fds carries "streams" (one
// {"id":N,"kind":K} per fd, in the fds' order) and the bytes follow as
// {"op":"data","stream":N,"data":BASE64} frames, each stream ended by {"op":"eof","stream":N}.
// The server's gateway (tls_gateway.cpp) and the client's relay (tls_relay.cpp) translate between
// the two, so the ops themselves never know which listener a client came through.
#pragma once

#include <poll.h>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/tls.hpp"

namespace rlm::server {

// What a stream stands in for.
enum class StreamKind {
  in,        // bytes the client sends while the op runs (a pipe's read end at the server): stdin,
             // a session's context, add_context's input
  out,       // bytes the server sends while the op runs (a pipe's write end): stdout, stderr
  file_in,   // a whole file the client sends before the op starts (a memfd): load's save file
  file_out,  // a whole file the server sends before the op's answer (a memfd): save's file
};
std::string_view to_string(StreamKind kind);
std::optional<StreamKind> stream_kind_named(std::string_view name);

// The kinds of the fds a client's frame carries, by its op: run [in, out, out]; session_open and
// add_context [in]; save [file_out]; load [file_in]. nullopt when the op takes no fds or not
// `count` of them.
std::optional<std::vector<StreamKind>> stream_kinds_of(std::string_view op, std::size_t count);

// A data frame carries at most this many bytes (64 KiB once in base64).
inline constexpr std::size_t kStreamChunk = 48u << 10;
// No data or eof frame is longer than this.
inline constexpr std::size_t kMaxStreamFrame = 80u << 10;
// At most this many streams are open on one connection at once.
inline constexpr std::size_t kMaxOpenStreams = 8;

nlohmann::json data_frame(std::uint32_t stream, std::string_view bytes);
nlohmann::json eof_frame(std::uint32_t stream);
// A data frame's bytes; throws WireError for a frame that is not one (bad base64, too long).
std::string data_of(const nlohmann::json& frame);
// A data or eof frame's stream id; throws WireError when it has none.
std::uint32_t stream_of(const nlohmann::json& frame);

// Frames read off a TLS stream without waiting: bytes are gathered until a whole frame is there,
// bounded by `max_bytes` per frame; parsed with the control channel's bounded parser.
class TlsFrameReader {
 public:
  // A frame over kUnbudgetedFrameBytes is gathered only with a reservation from `account`'s
  // budget (FrameRefused when it does not fit), given back once it is parsed.
  explicit TlsFrameReader(std::uint64_t max_bytes, FrameAccount account = {})
      : max_bytes_(max_bytes), account_(account) {}
  // Reads what `stream` has now. False at the peer's end of stream (with no frame half-read;
  // WireError when one was). Throws WireError for a frame over the bound or malformed. With
  // `pass`, a frame too large to be a data or eof frame (a result, a cell result, an LM call) is
  // not gathered: its bytes, header first, go to `pass` as they arrive (a relay then holds none
  // of it whole).
  bool fill(TlsStream& stream, const std::function<void(std::string_view)>& pass = {});
  // The next whole frame, if one is there ("op" checked to be a string).
  std::optional<nlohmann::json> next();
  // Bytes held (the frame being gathered).
  std::size_t held() const { return buffer_.size() - start_; }
  // Whether a large frame is being passed on (fill's `pass` has had part of it).
  bool passing() const { return passing_ != 0; }

 private:
  void compact();  // drops the bytes of frames taken
  // The length the next frame's header announces (4 bytes held); WireError past max_bytes.
  std::uint64_t announced_length() const;
  std::uint64_t max_bytes_;
  FrameAccount account_;
  FrameBudget::Reservation reservation_;  // for the frame being gathered
  bool reserved_ = false;
  std::uint64_t passing_ = 0;  // bytes of a large frame still to pass on
  std::string buffer_;
  std::size_t start_ = 0;
};

// Sends one frame whole on `stream` by `deadline` (WireError otherwise).
void send_tls_frame(TlsStream& stream, const nlohmann::json& message, Clock::time_point deadline);

// Frames gathered while their sender has more to do, written in one go when it would wait (one
// TLS record and one wake-up of the peer instead of one per frame: a run's started, eofs, result
// and idle). Past 256 KiB held it writes at once.
class FrameOutbox {
 public:
  void add(TlsStream& stream, const nlohmann::json& message, Clock::time_point deadline);
  // Writes what is held by `deadline` (WireError otherwise).
  void flush(TlsStream& stream, Clock::time_point deadline);
  bool empty() const { return held_.empty(); }

 private:
  std::string held_;
};

// poll() for a relay with frames held: at once if something is ready; otherwise they are written
// first, then it waits `timeout_ms`.
int poll_after_flush(std::vector<pollfd>& fds, int timeout_ms, FrameOutbox& outbox,
                     TlsStream& stream, Clock::time_point flush_deadline);

}  // namespace rlm::server
