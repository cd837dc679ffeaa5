// Drives one hijacked attach connection on the caller's thread: feeds the payload's stdin
// (Request::stdin_data or stdin_fd, then a half-close so it sees EOF), splits the multiplexed
// output into stdout and stderr under the policy's per-stream cap, and stops at the wall deadline
// or when the caller's stop_fd (or the CPU watch's limit_fd) becomes readable. It never signals
// anything itself: what to stop and how is the caller's (a container's whole tree).
//
// Docker's multiplexed stream (attach and exec without a TTY): each frame is an 8-byte header --
// the stream (0 stdin, 1 stdout, 2 stderr), three zero bytes, a big-endian 32-bit length -- then
// that many bytes of payload. Frames arrive split and joined arbitrarily across reads.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "docker/hijack.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::docker {

// ---- The framing -------------------------------------------------------------------------------

enum class StreamKind : std::uint8_t { stdin_stream = 0, stdout_stream = 1, stderr_stream = 2 };

class FrameDemuxer {
 public:
  // Receives each piece of payload as it arrives (a frame may come in several pieces). Returning
  // false stops delivery: feed() returns at once and later data is dropped.
  using Sink = std::function<bool(StreamKind, std::string_view)>;
  explicit FrameDemuxer(Sink sink) : sink_(std::move(sink)) {}

  // Takes the next bytes of the connection. Returns false once the sink asked to stop or the
  // stream is malformed (an unknown stream byte or non-zero padding): see malformed().
  bool feed(std::string_view bytes);

  bool malformed() const { return malformed_; }
  // True between frames: nothing was cut off if the connection ends here.
  bool at_frame_boundary() const { return header_filled_ == 0 && payload_left_ == 0; }

 private:
  bool take_header();

  Sink sink_;
  std::array<unsigned char, 8> header_{};
  std::size_t header_filled_ = 0;
  std::uint32_t payload_left_ = 0;
  StreamKind current_ = StreamKind::stdout_stream;
  bool stopped_ = false;
  bool malformed_ = false;
};

// ---- The pump ----------------------------------------------------------------------------------

// True when the payload's stdin carries data (Request::stdin_data or stdin_fd); otherwise it is
// /dev/null, as Docker gives a container without an attached stdin.
inline bool wants_stdin(const Request& request) {
  return request.stdin_fd >= 0 || !request.stdin_data.empty();
}

enum class StreamEnd {
  closed,        // the daemon ended the stream: the payload's stdout and stderr are closed
  deadline,      // the wall deadline came first
  output_limit,  // stdout or stderr went past the cap
  cancelled,     // the caller's stop_fd became readable
  cpu_limit,     // limit_fd became readable: the container used its CPU time
  caller_error,  // an output callback threw (StreamOutcome::caller_error)
};

struct StreamSettings {
  bool feeds_stdin = false;  // the connection carries the payload's stdin
  std::string_view stdin_data;
  int stdin_fd = -1;  // replaces stdin_data when >= 0; read until EOF, never closed
  std::uint64_t output_cap = 0;
  std::function<void(std::string_view)> on_stdout, on_stderr;  // else kept in the outcome
  std::chrono::steady_clock::time_point deadline;
  int stop_fd = -1;
  int limit_fd = -1;  // readable once the container's CPU time is spent (StatsSampler)
};

// The settings every docker run derives from its request and policy: stdin (fed when
// wants_stdin(request)), the output cap and callbacks, the stop fd, and `deadline`.
StreamSettings stream_settings(const Request& request, const Policy& policy,
                               std::chrono::steady_clock::time_point deadline);

struct StreamOutcome {
  StreamEnd end = StreamEnd::closed;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  std::exception_ptr caller_error;
  std::string protocol_error;  // the stream was not Docker's framing ("" when it was)
};

StreamOutcome pump_stream(HijackedConnection& connection, const StreamSettings& settings);

}  // namespace rlm::docker
