// An egress allowlist's entries (rlm_sandbox/policy.hpp, NetworkRule): read from their text, and
// compared (whether one entry lets through no more than another: a client's narrowing of an
// offered allowlist, `run --allow-net`).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rlm_sandbox/policy.hpp"

namespace rlm::policy {

// `text` as an allow entry (a port required unless https:// or http://) or, when `deny`, a deny
// entry (the port optional). nullopt with `why` set to what is wrong and how to write it.
std::optional<NetworkRule> parse_network_rule(std::string_view text, bool deny, std::string& why);

// Whether every connection `narrow` lets through, `wide` lets through too.
bool covers(const NetworkRule& wide, const NetworkRule& narrow);

// Whether some rule of `rules` covers `rule`.
bool covered_by_any(const std::vector<NetworkRule>& rules, const NetworkRule& rule);

}  // namespace rlm::policy
