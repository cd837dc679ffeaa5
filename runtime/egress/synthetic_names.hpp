// The addresses the sandbox's DNS hands out: each allowed name the sandbox asks for gets its own
// address in 198.18.0.0/15 (RFC 2544's benchmarking range, never routed on the internet) for the
// sandbox's life, so a connection's destination says which name it was made for. The sandbox
// never learns a real address, and no query leaves the host until it connects. Thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "egress/address.hpp"

namespace rlm::egress {

class SyntheticNames {
 public:
  explicit SyntheticNames(std::size_t capacity) : capacity_(capacity) {}

  // The address bound to `name`, binding the next free one; nullopt once `capacity` names are.
  std::optional<IpAddress> bind(const std::string& name);
  // The name bound to `address`; nullopt for any other address.
  std::optional<std::string> name_of(const IpAddress& address) const;
  // Whether `address` is in the synthetic range (bound or not).
  static bool synthetic(const IpAddress& address);

 private:
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::unordered_map<std::string, std::uint32_t> by_name_;  // name -> offset in the range
  std::map<std::uint32_t, std::string> by_offset_;
};

}  // namespace rlm::egress
