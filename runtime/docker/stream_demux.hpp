// Docker's multiplexed stream (attach and exec without a TTY): each frame is an 8-byte header --
// the stream (0 stdin, 1 stdout, 2 stderr), three zero bytes, a big-endian 32-bit length -- then
// that many bytes of payload. Frames arrive split and joined arbitrarily across reads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>

namespace rlm::docker {

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

}  // namespace rlm::docker
