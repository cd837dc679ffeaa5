// Turns the bytes a sandbox sends on its control channel into JSON objects
// (docs/control-channel.md: a 4-byte big-endian length, then that many bytes of JSON). Everything
// here is hostile input: the length is capped, the nesting depth is bounded while parsing (never
// recursing on the sandbox's data), and errors describe what was wrong without echoing what was
// sent. No I/O: the Channel reads, the fuzz harness (tests/fuzz/channel_frame_fuzz.cpp) feeds bytes
// directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rlm::session {

// Deeper than this (objects and arrays counted together, the frame's own object being 1) and a
// frame is refused: no message of the protocol nests more than 3 levels; a `final` value gets the
// rest.
inline constexpr std::size_t kMaxFrameDepth = 64;
// More values than this (every scalar, object and array counted, the frame's own object too) and a
// frame is refused: a parsed value costs the host up to ~100 bytes however few bytes it took in
// the frame (`{}`), so a frame of millions of tiny values would cost gigabytes. The protocol's
// largest message, a batch of 10,000 prompts, holds some 10,000; a `final` value with more is sent
// as its repr() by the worker (MAX_FINAL_VALUES).
inline constexpr std::size_t kMaxFrameValues = 100'000;

class FrameDecoder {
 public:
  static constexpr std::size_t kHeader = 4;

  explicit FrameDecoder(std::uint64_t max_frame) : max_frame_(max_frame) {}

  // How many bytes may be appended next: the rest of the current frame's header or body, so that
  // no read crosses from one frame into the next. 0 when the stream is broken (an oversize length:
  // next() says so).
  std::size_t want() const;
  // True when the next byte appended is a frame's first byte.
  bool at_frame_start() const { return partial_.empty(); }
  // Appends `size` bytes, at most want().
  void append(const char* data, std::size_t size);

  // The number of frames whose first byte has been appended (the current, partial one included).
  std::uint64_t frames_started() const { return taken_ + complete_.size() + !partial_.empty(); }
  // The number of frames next() has returned (or refused).
  std::uint64_t frames_taken() const { return taken_; }

  // The next complete frame, if one has arrived. Throws Error for a frame over the cap, one that
  // is not a JSON object, one nested deeper than kMaxFrameDepth or one holding more than
  // kMaxFrameValues values: the caller ends the session.
  std::optional<nlohmann::json> next();

  // Bytes held: complete frames not yet taken and the partial one.
  std::uint64_t buffered() const { return buffered_; }
  // The partial frame's bytes so far.
  std::size_t partial_bytes() const { return partial_.size(); }

 private:
  std::uint64_t max_frame_;
  std::string partial_;               // the frame being filled, header included
  std::deque<std::string> complete_;  // complete frames (header included), oldest first
  std::uint64_t buffered_ = 0;
  std::uint64_t taken_ = 0;
};

// Parses one frame body: a JSON object nested at most `max_depth` deep and holding at most
// `max_values` values, without recursion. Throws Error saying what was wrong (never quoting the
// body).
nlohmann::json parse_frame_body(std::string_view body, std::size_t max_depth = kMaxFrameDepth,
                                std::size_t max_values = kMaxFrameValues);

// A frame in words for an error message: its type when that is a short printable string, and its
// number of fields. Never the frame's content, never recursive.
std::string describe_frame(const nlohmann::json& frame);

}  // namespace rlm::session
