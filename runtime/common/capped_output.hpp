// One output stream of the payload, capped at the policy's output_bytes: kept in a string or handed
// to a callback as it arrives. Never holds more than the cap, whatever the payload writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace rlm::common {

class CappedOutput {
 public:
  using Sink = std::function<void(std::string_view)>;
  // With a sink, data goes there and `kept` stays empty; without one, it is appended to `kept`.
  CappedOutput(std::uint64_t cap, Sink sink, std::string& kept);

  // Takes a chunk read from the payload. Returns true when this chunk crossed the cap: the part
  // that fits has been taken, the rest is dropped, and so is everything after it. Exceptions
  // thrown by the sink propagate.
  bool accept(std::string_view chunk);

  bool truncated() const { return truncated_; }
  // Stop delivering (the sink threw); later data is counted as dropped.
  void silence() { silenced_ = true; }

 private:
  std::uint64_t cap_;
  std::uint64_t taken_ = 0;
  Sink sink_;
  std::string& kept_;
  bool truncated_ = false;
  bool silenced_ = false;
};

}  // namespace rlm::common
