// Turns the bytes a sandbox sends on its control channel into JSON objects
// (docs/control-channel.md: a 4-byte big-endian length, then that many bytes of JSON; a length
// with its top bit set is a bulk frame: raw UTF-8 bytes, taken by the JSON frame after it).
// Everything here is hostile input: the length is capped, the nesting depth is bounded while
// parsing (never recursing on the sandbox's data), and errors describe what was wrong without
// echoing what was sent. No I/O: the Channel reads, the fuzz harness
// (tests/fuzz/channel_frame_fuzz.cpp) feeds bytes directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
// Bulk frames before one JSON frame: one per string of a batch at most.
inline constexpr std::size_t kMaxBulkFrames = 10'000;
// The header's top bit: the frame is bulk (raw bytes), its length the other 31 bits.
inline constexpr std::uint32_t kBulkBit = 0x8000'0000u;

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
  // How many bytes the frame being received still needs before next() can return it: 0 between
  // frames; a JSON frame with bulk frames before it counts as one frame, from its first bulk
  // frame's first byte.
  std::size_t frame_wants() const;
  // Appends `size` bytes, at most want().
  void append(const char* data, std::size_t size);

  // The number of frames whose first byte has been appended (the current, partial one included).
  std::uint64_t frames_started() const {
    return taken_ + complete_frames_ + bulk_.size() + !partial_.empty();
  }
  // The number of frames next() has returned (or refused).
  std::uint64_t frames_taken() const { return taken_; }

  // The next complete frame, if one has arrived, with each `{"$bulk": i}` in it (a top-level
  // field's value, or an item of a top-level array) replaced by the i-th bulk frame before it as
  // a string (its "bulk" field, their count, removed). Throws Error for a frame over the cap
  // (with its bulk frames: their bodies together), one that is not a JSON object, one nested
  // deeper than kMaxFrameDepth or holding more than kMaxFrameValues values, bulk bytes that are
  // not UTF-8, or bulk frames its placeholders do not take exactly once each: the caller ends
  // the session.
  std::optional<nlohmann::json> next();

  // Bytes held: complete frames not yet taken and the partial one.
  std::uint64_t buffered() const { return buffered_; }
  // The bytes so far of the frame being received (its bulk frames included).
  std::size_t partial_bytes() const {
    return static_cast<std::size_t>(bulk_bytes_) + partial_.size();
  }

 private:
  // A JSON frame and the bulk frames before it, each with its header.
  struct Group {
    std::vector<std::string> bulk;
    std::string frame;
  };

  std::uint32_t body_length() const;
  void refuse(std::string why);

  std::uint64_t max_frame_;
  std::string partial_;                // the frame being filled, header included
  std::vector<std::string> bulk_;      // complete bulk frames waiting for their JSON frame
  std::uint64_t bulk_bytes_ = 0;       // their bytes, headers included
  std::uint64_t bulk_body_bytes_ = 0;  // their bodies
  std::deque<Group> complete_;         // oldest first
  std::uint64_t complete_frames_ = 0;  // frames (bulk ones included) in complete_
  std::string broken_;                 // why the stream cannot go on, once it cannot
  std::uint64_t buffered_ = 0;
  std::uint64_t taken_ = 0;
};

// Parses one frame body: a JSON object nested at most `max_depth` deep and holding at most
// `max_values` values, without recursion. Throws Error saying what was wrong (never quoting the
// body).
nlohmann::json parse_frame_body(std::string_view body, std::size_t max_depth = kMaxFrameDepth,
                                std::size_t max_values = kMaxFrameValues);

// One frame the host sends, apart: its header (the body's length, 4 bytes big-endian) and its body
// (compact JSON, keys in order, invalid UTF-8 replaced by U+FFFD). Kept apart so that a large
// body is never copied to join them. The golden corpus (tests/golden/) checks it byte for byte.
struct EncodedFrame {
  std::string header;
  std::string body;
};
EncodedFrame encode_frame(const nlohmann::json& message);

// A frame in words for an error message: its type when that is a short printable string, and its
// number of fields. Never the frame's content, never recursive.
std::string describe_frame(const nlohmann::json& frame);

}  // namespace rlm::session
