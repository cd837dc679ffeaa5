#include "policy/network_rules.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <tuple>

namespace rlm::policy {
namespace {

bool lowercase_ldh(std::string_view label) {
  if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
    return false;
  return std::all_of(label.begin(), label.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// A host name as the policy takes it; "" when fine, else what is wrong.
std::string name_problem(std::string_view name) {
  if (name.empty()) return "no name";
  if (name.back() == '.') return "a name ends without a dot";
  if (std::any_of(name.begin(), name.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
    return "names are written in lowercase";
  if (name.size() > 253) return "a name is at most 253 characters";
  std::size_t start = 0;
  for (;;) {
    const auto dot = name.find('.', start);
    const auto label = name.substr(start, dot == std::string_view::npos ? name.npos : dot - start);
    if (!lowercase_ldh(label))
      return "each label of a name is 1 to 63 of a-z, 0-9 and '-', not at either end "
             "(punycode for other scripts: xn--...)";
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  // All digits and dots would be an address, which only a CIDR entry names.
  if (name.find_first_not_of("0123456789.") == std::string_view::npos)
    return "an address is named by a CIDR entry (1.2.3.4/32:PORT)";
  return "";
}

std::optional<std::uint16_t> port_number(std::string_view text) {
  unsigned value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value == 0 ||
      value > 65535)
    return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

// "443" or "8000-8100" into the rule; false when it is neither.
bool read_ports(std::string_view text, NetworkRule& rule) {
  const auto dash = text.find('-');
  const auto first = port_number(text.substr(0, dash));
  const auto last = dash == text.npos ? first : port_number(text.substr(dash + 1));
  if (!first || !last || *last < *first) return false;
  rule.first_port = *first;
  rule.last_port = *last;
  return true;
}

// "10.0.0.0/8" or "2001:db8::/32" into the rule; "" when fine.
std::string read_cidr(std::string_view text, bool ipv6, NetworkRule& rule) {
  const auto slash = text.find('/');
  if (slash == text.npos)
    return "an address needs its prefix length: write " + std::string(text) +
           (ipv6 ? "/128" : "/32") + " for the one address";
  const std::string address(text.substr(0, slash));
  unsigned prefix = 0;
  const auto length = text.substr(slash + 1);
  const auto [end, error] = std::from_chars(length.data(), length.data() + length.size(), prefix);
  if (length.empty() || error != std::errc() || end != length.data() + length.size() ||
      prefix > (ipv6 ? 128u : 32u))
    return "the prefix length must be 0 to " + std::string(ipv6 ? "128" : "32");
  if (inet_pton(ipv6 ? AF_INET6 : AF_INET, address.c_str(), rule.address.data()) != 1)
    return std::string("not an IPv") + (ipv6 ? "6" : "4") + " address: " + address;
  const unsigned bytes = ipv6 ? 16 : 4;
  for (unsigned bit = prefix; bit < bytes * 8; ++bit)
    if (rule.address[bit / 8] & (0x80 >> (bit % 8)))
      return "the address has bits set beyond its prefix (/" + std::to_string(prefix) +
             "): write the network's first address";
  rule.kind = NetworkRule::Kind::cidr;
  rule.ipv6 = ipv6;
  rule.prefix = prefix;
  return "";
}

bool ports_within(const NetworkRule& wide, const NetworkRule& narrow) {
  if (wide.first_port == 0) return true;  // every port
  if (narrow.first_port == 0) return false;
  return wide.first_port <= narrow.first_port && narrow.last_port <= wide.last_port;
}

bool below(const std::string& name, const std::string& zone) {
  return name.size() > zone.size() + 1 &&
         name.compare(name.size() - zone.size(), zone.size(), zone) == 0 &&
         name[name.size() - zone.size() - 1] == '.';
}

}  // namespace

std::optional<NetworkRule> parse_network_rule(std::string_view text, bool deny, std::string& why) {
  NetworkRule rule;
  rule.text = std::string(text);
  std::string_view rest = text;
  if (rest.empty()) {
    why = "an empty entry";
    return std::nullopt;
  }
  for (const auto& [prefix, scheme, port] :
       {std::tuple{std::string_view("https://"), NetworkRule::Scheme::https, 443},
        std::tuple{std::string_view("http://"), NetworkRule::Scheme::http, 80}}) {
    if (rest.substr(0, prefix.size()) != prefix) continue;
    rest.remove_prefix(prefix.size());
    if (rest.find_first_of(":/") != rest.npos) {
      why = std::string(prefix) + " takes a name only (port " + std::to_string(port) +
            ", no path); for another port write NAME:PORT";
      return std::nullopt;
    }
    rule.scheme = scheme;
    rule.first_port = rule.last_port = static_cast<std::uint16_t>(port);
    break;
  }
  const bool by_scheme = rule.scheme != NetworkRule::Scheme::tcp;
  std::string_view host = rest, ports;
  bool port_given = false;
  if (!by_scheme) {
    if (rest.front() == '[') {  // [IPv6/len]:port
      const auto close = rest.find(']');
      const auto after = close == rest.npos ? rest : rest.substr(close + 1);
      if (close == rest.npos || (!after.empty() && after.front() != ':')) {
        why = "an IPv6 entry is [ADDRESS/LENGTH]:PORT";
        return std::nullopt;
      }
      host = rest.substr(1, close - 1);
      port_given = !after.empty();
      if (port_given) ports = after.substr(1);
      if (const auto problem = read_cidr(host, true, rule); !problem.empty()) {
        why = problem;
        return std::nullopt;
      }
    } else {
      const auto colon = rest.rfind(':');
      port_given = colon != rest.npos;
      if (port_given) {
        host = rest.substr(0, colon);
        ports = rest.substr(colon + 1);
      }
      if (host.find(':') != host.npos) {
        why = "an IPv6 address is written in brackets: [ADDRESS/LENGTH]:PORT";
        return std::nullopt;
      }
      if (host.find('/') != host.npos) {
        if (const auto problem = read_cidr(host, false, rule); !problem.empty()) {
          why = problem;
          return std::nullopt;
        }
      }
    }
    if (!port_given && !deny) {
      why = rule.kind == NetworkRule::Kind::cidr
                ? "needs a port: " + std::string(rest) + ":PORT"
                : "needs a port (" + std::string(rest) + ":443), or say the protocol: https://" +
                      std::string(rest) + " or http://" + std::string(rest);
      return std::nullopt;
    }
    if (port_given && !read_ports(ports, rule)) {
      why = "the port must be 1 to 65535, or a range FIRST-LAST";
      return std::nullopt;
    }
  }
  if (rule.kind == NetworkRule::Kind::cidr) return rule;
  std::string name(host);
  if (name == "*" || name.empty()) {
    why = "no bare *: name the domain (*.example.com:443)";
    return std::nullopt;
  }
  if (name.rfind("*.", 0) == 0) {
    rule.kind = NetworkRule::Kind::wildcard;
    name.erase(0, 2);
  }
  if (name.find('*') != std::string::npos) {
    why = "* stands only for the leftmost labels: *.example.com";
    return std::nullopt;
  }
  if (const auto problem = name_problem(name); !problem.empty()) {
    why = problem;
    return std::nullopt;
  }
  if (rule.kind == NetworkRule::Kind::wildcard && name.find('.') == std::string::npos) {
    why = "a wildcard covers names below a domain, not a whole top-level domain: *." + name +
          " would match every ." + name + " name";
    return std::nullopt;
  }
  rule.name = std::move(name);
  return rule;
}

bool covers(const NetworkRule& wide, const NetworkRule& narrow) {
  if (!ports_within(wide, narrow)) return false;
  // A raw TCP rule lets through what a checked protocol would; a checked one only its own.
  if (wide.scheme != NetworkRule::Scheme::tcp && wide.scheme != narrow.scheme) return false;
  using Kind = NetworkRule::Kind;
  if (wide.kind == Kind::cidr || narrow.kind == Kind::cidr) {
    if (wide.kind != Kind::cidr || narrow.kind != Kind::cidr || wide.ipv6 != narrow.ipv6 ||
        narrow.prefix < wide.prefix)
      return false;
    for (unsigned bit = 0; bit < wide.prefix; ++bit)
      if ((wide.address[bit / 8] ^ narrow.address[bit / 8]) & (0x80 >> (bit % 8))) return false;
    return true;
  }
  if (wide.kind == Kind::name) return narrow.kind == Kind::name && narrow.name == wide.name;
  // A wildcard covers the names below its zone, and narrower wildcards.
  return below(narrow.name, wide.name) ||
         (narrow.kind == Kind::wildcard && narrow.name == wide.name);
}

bool covered_by_any(const std::vector<NetworkRule>& rules, const NetworkRule& rule) {
  return std::any_of(rules.begin(), rules.end(),
                     [&](const NetworkRule& wide) { return covers(wide, rule); });
}

}  // namespace rlm::policy
