// The policies in policies/*.json, compiled into the library so an installed rlm-sandbox needs no
// data files. The definition is generated at configure time (see CMakeLists.txt).
#pragma once

#include <span>
#include <string_view>

namespace rlm::policy {

struct ShippedPolicy {
  std::string_view name;  // file name without ".json"
  std::string_view text;  // the file's contents, verbatim
};

// Sorted by name.
std::span<const ShippedPolicy> shipped_policies();

}  // namespace rlm::policy
