#include "docker/stream_demux.hpp"

#include <algorithm>

namespace rlm::docker {

bool FrameDemuxer::take_header() {
  const unsigned char kind = header_[0];
  if (kind > 2 || header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
    malformed_ = true;
    return false;
  }
  current_ = static_cast<StreamKind>(kind);
  payload_left_ = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16) |
                  (std::uint32_t{header_[6]} << 8) | std::uint32_t{header_[7]};
  header_filled_ = 0;
  return true;
}

bool FrameDemuxer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    if (stopped_ || malformed_) return false;
    if (payload_left_ == 0) {
      const std::size_t take = std::min(bytes.size(), header_.size() - header_filled_);
      std::copy_n(bytes.data(), take, header_.data() + header_filled_);
      header_filled_ += take;
      bytes.remove_prefix(take);
      if (header_filled_ == header_.size() && !take_header()) return false;
      continue;
    }
    const std::size_t take = std::min<std::size_t>(bytes.size(), payload_left_);
    payload_left_ -= static_cast<std::uint32_t>(take);
    if (!sink_(current_, bytes.substr(0, take))) stopped_ = true;
    bytes.remove_prefix(take);
  }
  return !stopped_ && !malformed_;
}

}  // namespace rlm::docker
