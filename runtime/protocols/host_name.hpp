// The one rule for a host name the egress proxy compares with its allowlist, shared by the
// ClientHello's server_name and HTTP's Host and absolute-form target, so that a name is judged
// the same whichever way it arrives.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace rlm::protocols {

// `raw` lowercased with one trailing dot removed, or nullopt unless it is 1..255 bytes of
// letters, digits, '-', '.' and '_' whose labels are 1..63 bytes ("a..b", ".a" and "." are not
// names: a name with an empty label matches nothing an allowlist could mean).
inline std::optional<std::string> normalize_host_name(std::string_view raw) {
  if (raw.empty() || raw.size() > 255) return std::nullopt;
  if (raw.back() == '.') raw.remove_suffix(1);
  if (raw.empty()) return std::nullopt;
  std::string name;
  name.reserve(raw.size());
  std::size_t label = 0;
  for (char c : raw) {
    if (c == '.') {
      if (label == 0) return std::nullopt;
      label = 0;
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
      ++label;
    } else if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
      ++label;
    } else {
      return std::nullopt;
    }
    if (label > 63) return std::nullopt;
    name.push_back(c);
  }
  if (label == 0) return std::nullopt;  // "a.." ended on an empty label
  return name;
}

}  // namespace rlm::protocols
