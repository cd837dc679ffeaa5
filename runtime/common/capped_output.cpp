#include "common/capped_output.hpp"

#include <algorithm>

namespace rlm::common {

CappedOutput::CappedOutput(std::uint64_t cap, Sink sink, std::string& kept)
    : cap_(cap), sink_(std::move(sink)), kept_(kept) {}

bool CappedOutput::accept(std::string_view chunk) {
  if (truncated_) return false;
  const auto room = static_cast<std::size_t>(std::min<std::uint64_t>(cap_ - taken_, chunk.size()));
  const bool crossed = room < chunk.size();
  truncated_ = crossed;
  taken_ += room;
  if (room > 0 && !silenced_) {
    if (sink_)
      sink_(chunk.substr(0, room));
    else
      kept_.append(chunk.data(), room);
  }
  return crossed;
}

}  // namespace rlm::common
