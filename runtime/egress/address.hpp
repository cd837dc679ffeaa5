// An IP address as the egress proxy handles it: the destination a sandbox dialled, an upstream
// the host side resolved. IPv4-mapped IPv6 addresses (what a dual-stack listener reports for an
// IPv4 connection) are IPv4 here, so one rule matches either way.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

struct IpAddress {
  std::array<std::uint8_t, 16> bytes{};  // IPv4 in the first 4
  bool ipv6 = false;
  bool operator==(const IpAddress&) const = default;
};

struct Endpoint {
  IpAddress address;
  std::uint16_t port = 0;
};

// From a socket address (AF_INET or AF_INET6; v4-mapped becomes IPv4). nullopt for others.
std::optional<Endpoint> endpoint_from(const sockaddr_storage& address);
// To one, for connect().
socklen_t to_sockaddr(const Endpoint& endpoint, sockaddr_storage& out);
std::string to_string(const IpAddress& address);
// "HOST:PORT" or "[V6]:PORT" with a literal address (RLM_SANDBOX_RESOLVER's form).
std::optional<Endpoint> parse_endpoint(const std::string& text);

// Whether `address` is one a name must not resolve to unless the policy says "private": true:
// unspecified, loopback, RFC 1918, link-local (cloud metadata), CGNAT, benchmarking (the proxy's
// own synthetic range), multicast and broadcast; ULA, IPv6 link-local, site-local, multicast,
// Teredo and local-use NAT64 (64:ff9b:1::/48), and IPv4 inside IPv4-mapped, NAT64 (64:ff9b::/96)
// and 6to4 (2002::/16) IPv6 addresses by the same rules.
bool is_private(const IpAddress& address);

// Whether `rule` (a CIDR entry) holds `address`.
bool cidr_holds(const NetworkRule& rule, const IpAddress& address);

}  // namespace rlm::egress
