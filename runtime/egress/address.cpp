#include "egress/address.hpp"

#include <arpa/inet.h>

#include <cstring>

namespace rlm::egress {
namespace {

bool v4_private(const std::uint8_t* a) {
  return a[0] == 0 || a[0] == 10 || a[0] == 127 || (a[0] == 169 && a[1] == 254) ||
         (a[0] == 172 && (a[1] & 0xf0) == 16) || (a[0] == 192 && a[1] == 168) ||
         (a[0] == 100 && (a[1] & 0xc0) == 64) || (a[0] == 198 && (a[1] & 0xfe) == 18) ||
         (a[0] == 192 && a[1] == 0 && a[2] == 0) || a[0] >= 224;  // IETF; multicast, reserved
}

}  // namespace

std::optional<Endpoint> endpoint_from(const sockaddr_storage& address) {
  Endpoint endpoint;
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    std::memcpy(endpoint.address.bytes.data(), &v4.sin_addr, 4);
    endpoint.port = ntohs(v4.sin_port);
    return endpoint;
  }
  if (address.ss_family != AF_INET6) return std::nullopt;
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
  endpoint.port = ntohs(v6.sin6_port);
  if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
    std::memcpy(endpoint.address.bytes.data(), v6.sin6_addr.s6_addr + 12, 4);
    return endpoint;
  }
  endpoint.address.ipv6 = true;
  std::memcpy(endpoint.address.bytes.data(), v6.sin6_addr.s6_addr, 16);
  return endpoint;
}

socklen_t to_sockaddr(const Endpoint& endpoint, sockaddr_storage& out) {
  out = {};
  if (!endpoint.address.ipv6) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(out);
    v4.sin_family = AF_INET;
    v4.sin_port = htons(endpoint.port);
    std::memcpy(&v4.sin_addr, endpoint.address.bytes.data(), 4);
    return sizeof v4;
  }
  auto& v6 = reinterpret_cast<sockaddr_in6&>(out);
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(endpoint.port);
  std::memcpy(v6.sin6_addr.s6_addr, endpoint.address.bytes.data(), 16);
  return sizeof v6;
}

std::string to_string(const IpAddress& address) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(address.ipv6 ? AF_INET6 : AF_INET, address.bytes.data(), text, sizeof text);
  return text;
}

std::optional<Endpoint> parse_endpoint(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return std::nullopt;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const unsigned long number = std::stoul(port);
  if (number == 0 || number > 65535) return std::nullopt;
  Endpoint endpoint;
  endpoint.port = static_cast<std::uint16_t>(number);
  if (inet_pton(AF_INET, host.c_str(), endpoint.address.bytes.data()) == 1) return endpoint;
  if (inet_pton(AF_INET6, host.c_str(), endpoint.address.bytes.data()) == 1) {
    endpoint.address.ipv6 = true;
    return endpoint;
  }
  return std::nullopt;
}

bool is_private(const IpAddress& address) {
  const std::uint8_t* a = address.bytes.data();
  if (!address.ipv6) return v4_private(a);
  static constexpr std::uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr std::uint8_t kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(a, kMapped, 12) == 0 || std::memcmp(a, kNat64, 12) == 0)
    return v4_private(a + 12);
  // 6to4 (2002::/16) carries an IPv4 address in its next 4 bytes; Teredo (2001::/32) tunnels to
  // one obfuscated; 64:ff9b:1::/48 is NAT64 for local use.
  if (a[0] == 0x20 && a[1] == 0x02) return v4_private(a + 2);
  if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0 && a[3] == 0) return true;
  if (a[0] == 0 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && a[4] == 0 && a[5] == 1)
    return true;
  bool zero_prefix = true;  // ::, ::1 and the deprecated IPv4-compatible ::a.b.c.d
  for (int i = 0; i < 12; ++i) zero_prefix = zero_prefix && a[i] == 0;
  if (zero_prefix) return true;
  return (a[0] & 0xfe) == 0xfc ||                    // ULA fc00::/7
         (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) ||  // link-local fe80::/10
         (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) ||  // site-local fec0::/10
         a[0] == 0xff;                               // multicast
}

bool cidr_holds(const NetworkRule& rule, const IpAddress& address) {
  if (rule.kind != NetworkRule::Kind::cidr || rule.ipv6 != address.ipv6) return false;
  const unsigned whole = rule.prefix / 8, rest = rule.prefix % 8;
  if (std::memcmp(rule.address.data(), address.bytes.data(), whole) != 0) return false;
  if (rest == 0) return true;
  const std::uint8_t mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (rule.address[whole] & mask) == (address.bytes[whole] & mask);
}

}  // namespace rlm::egress
