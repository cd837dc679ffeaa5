#include "egress/synthetic_names.hpp"

namespace rlm::egress {
namespace {

constexpr std::uint32_t kBase = (198u << 24) | (18u << 16);  // 198.18.0.0/15
constexpr std::uint32_t kSize = 1u << 17;

IpAddress address_at(std::uint32_t offset) {
  const std::uint32_t value = kBase + offset;
  IpAddress address;
  address.bytes[0] = static_cast<std::uint8_t>(value >> 24);
  address.bytes[1] = static_cast<std::uint8_t>(value >> 16);
  address.bytes[2] = static_cast<std::uint8_t>(value >> 8);
  address.bytes[3] = static_cast<std::uint8_t>(value);
  return address;
}

std::uint32_t offset_of(const IpAddress& address) {
  const auto& b = address.bytes;
  const std::uint32_t value =
      (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  return value - kBase;
}

}  // namespace

bool SyntheticNames::synthetic(const IpAddress& address) {
  return !address.ipv6 && address.bytes[0] == 198 && (address.bytes[1] & 0xfe) == 18;
}

std::optional<IpAddress> SyntheticNames::bind(const std::string& name) {
  std::lock_guard lock(mutex_);
  if (const auto found = by_name_.find(name); found != by_name_.end())
    return address_at(found->second);
  if (by_name_.size() >= capacity_ || by_name_.size() + 2 >= kSize) return std::nullopt;
  // Offsets from 1: never the network address; .x.0 and .x.255 are fine inside a /15.
  const auto offset = static_cast<std::uint32_t>(by_name_.size() + 1);
  by_name_.emplace(name, offset);
  by_offset_.emplace(offset, name);
  return address_at(offset);
}

std::optional<std::string> SyntheticNames::name_of(const IpAddress& address) const {
  if (!synthetic(address)) return std::nullopt;
  std::lock_guard lock(mutex_);
  const auto found = by_offset_.find(offset_of(address));
  if (found == by_offset_.end()) return std::nullopt;
  return found->second;
}

}  // namespace rlm::egress
