// Which allow entry lets a connection through (docs/network.md, "The rules"): by the name the
// sandbox's DNS bound to its destination, or by the destination address for CIDR entries. A deny
// entry covering the same name (or address) and port wins.
#pragma once

#include <cstdint>
#include <string_view>

#include "egress/address.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

// Whether a name entry (exact, or `*.zone`: names below zone at any depth, never zone itself)
// matches `name` (lowercase, no trailing dot).
bool name_matches(const NetworkRule& rule, std::string_view name);

// The first allow entry (name or wildcard) for (name, port) that no deny entry overrides; null
// when none.
const NetworkRule* rule_for_name(const Egress& egress, std::string_view name, std::uint16_t port);

// The first CIDR allow entry holding (address, port) that no deny entry overrides; null when none.
const NetworkRule* rule_for_address(const Egress& egress, const IpAddress& address,
                                    std::uint16_t port);

// Whether a deny entry covers `address` at `port` (a name's resolved upstream is checked so too).
bool address_denied(const Egress& egress, const IpAddress& address, std::uint16_t port);

// Whether some port of `name` is allowed: the sandbox's DNS answers it.
bool name_allowed(const Egress& egress, std::string_view name);

// Whether a connection on `rule` must be TLS (its ClientHello checked): https:// entries, and
// any name entry matched on port 443.
bool expects_tls(const NetworkRule& rule, std::uint16_t port);

}  // namespace rlm::egress
