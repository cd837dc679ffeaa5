#include "egress/rules.hpp"

namespace rlm::egress {
namespace {

bool port_in(const NetworkRule& rule, std::uint16_t port) {
  if (rule.first_port == 0 && rule.last_port == 0) return true;  // a deny entry's every port
  return port >= rule.first_port && port <= rule.last_port;
}

bool name_denied(const Egress& egress, std::string_view name, std::uint16_t port) {
  for (const auto& deny : egress.deny)
    if (name_matches(deny, name) && port_in(deny, port)) return true;
  return false;
}

bool name_denied_everywhere(const Egress& egress, std::string_view name) {
  for (const auto& deny : egress.deny)
    if (name_matches(deny, name) && deny.first_port == 0 && deny.last_port == 0) return true;
  return false;
}

}  // namespace

bool name_matches(const NetworkRule& rule, std::string_view name) {
  switch (rule.kind) {
    case NetworkRule::Kind::name:
      return name == rule.name;
    case NetworkRule::Kind::wildcard:
      // "a.zone", "b.a.zone": a label (at least one byte) and a dot before the zone.
      return name.size() > rule.name.size() + 1 && name.ends_with(rule.name) &&
             name[name.size() - rule.name.size() - 1] == '.';
    case NetworkRule::Kind::cidr:
      return false;
  }
  return false;
}

const NetworkRule* rule_for_name(const Egress& egress, std::string_view name, std::uint16_t port) {
  if (name_denied(egress, name, port)) return nullptr;
  for (const auto& rule : egress.allow)
    if (name_matches(rule, name) && port_in(rule, port)) return &rule;
  return nullptr;
}

const NetworkRule* rule_for_address(const Egress& egress, const IpAddress& address,
                                    std::uint16_t port) {
  if (address_denied(egress, address, port)) return nullptr;
  for (const auto& rule : egress.allow)
    if (cidr_holds(rule, address) && port_in(rule, port)) return &rule;
  return nullptr;
}

bool address_denied(const Egress& egress, const IpAddress& address, std::uint16_t port) {
  for (const auto& deny : egress.deny)
    if (cidr_holds(deny, address) && port_in(deny, port)) return true;
  return false;
}

bool name_allowed(const Egress& egress, std::string_view name) {
  if (name_denied_everywhere(egress, name)) return false;
  for (const auto& rule : egress.allow)
    if (name_matches(rule, name)) return true;
  return false;
}

bool expects_tls(const NetworkRule& rule, std::uint16_t port) {
  return rule.scheme == NetworkRule::Scheme::https ||
         (rule.scheme == NetworkRule::Scheme::tcp && port == 443);
}

}  // namespace rlm::egress
