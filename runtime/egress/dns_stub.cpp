#include "egress/dns_stub.hpp"

#include <string>

#include "egress/rules.hpp"
#include "protocols/dns_message.hpp"
#include "protocols/host_name.hpp"

namespace rlm::egress {
namespace {

using protocols::DnsRcode;

// "d.c.b.a.in-addr.arpa" -> a.b.c.d; nullopt for any other name.
std::optional<IpAddress> reverse_v4(const std::string& name) {
  constexpr std::string_view kSuffix = ".in-addr.arpa";
  if (!std::string_view(name).ends_with(kSuffix)) return std::nullopt;
  const std::string digits = name.substr(0, name.size() - kSuffix.size());
  IpAddress address;
  int part = 3;
  std::size_t start = 0;
  while (part >= 0) {
    const auto dot = digits.find('.', start);
    const std::string label = digits.substr(start, dot == std::string::npos ? dot : dot - start);
    if (label.empty() || label.size() > 3 ||
        label.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    const int value = std::stoi(label);
    if (value > 255) return std::nullopt;
    address.bytes[static_cast<std::size_t>(part--)] = static_cast<std::uint8_t>(value);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (part != -1) return std::nullopt;
  return address;
}

}  // namespace

std::vector<std::uint8_t> DnsStub::answer(std::span<const std::uint8_t> message) {
  std::string why;
  std::optional<std::uint16_t> id;
  const auto query = protocols::parse_dns_query(message, why, &id);
  if (!query) {
    account_.dns_refused();
    return id ? protocols::build_dns_error(*id, DnsRcode::format_error)
              : std::vector<std::uint8_t>{};
  }
  const auto& question = query->question;
  auto refuse = [&](DnsRcode rcode) {
    account_.dns_refused();
    account_.deny(Denial::dns, question.name, "", 53);
    return protocols::build_dns_response(*query, rcode, std::nullopt, nullptr, 0);
  };
  // Only a host name (letters, digits, '-', '_' in dot-separated labels) is looked at: a label
  // holding a NUL or other bytes must not match a wildcard and then be cut short by the host's
  // resolver into another name (a number taken for an address, a query leaving for a name the
  // policy never allowed).
  if (protocols::normalize_host_name(question.name) != question.name)
    return refuse(DnsRcode::name_error);
  if (question.klass != protocols::kDnsClassIn) return refuse(DnsRcode::refused);

  if (question.type == protocols::kDnsTypePtr) {
    const auto address = reverse_v4(question.name);
    const auto name = address ? names_.name_of(*address) : std::nullopt;
    if (!name) return refuse(DnsRcode::name_error);
    account_.dns_answered();
    return protocols::build_dns_response(*query, DnsRcode::no_error, std::nullopt, &*name,
                                         kTtlSeconds);
  }
  if (!name_allowed(*rules_.current(), question.name)) return refuse(DnsRcode::name_error);
  if (question.type != protocols::kDnsTypeA) {
    // AAAA, HTTPS, SVCB, TXT...: the name exists, with nothing of that type (NODATA).
    account_.dns_answered();
    return protocols::build_dns_response(*query, DnsRcode::no_error, std::nullopt, nullptr,
                                         kTtlSeconds);
  }
  const auto address = names_.bind(question.name);
  if (!address) {
    account_.dns_refused();
    account_.deny(Denial::limit, question.name, "", 53);
    return protocols::build_dns_response(*query, DnsRcode::refused, std::nullopt, nullptr, 0);
  }
  account_.dns_answered();
  std::array<std::uint8_t, 4> a{address->bytes[0], address->bytes[1], address->bytes[2],
                                address->bytes[3]};
  return protocols::build_dns_response(*query, DnsRcode::no_error, a, nullptr, kTtlSeconds);
}

}  // namespace rlm::egress
