// libFuzzer harness for the DNS messages the egress proxy reads
// (runtime/protocols/dns_message.hpp): the bytes a sandbox sends its resolver, and the bytes taken
// for an upstream's answer. Beyond the sanitizers, it checks what the proxy relies on: a query that
// parses is answered (A, PTR, NXDOMAIN) with bytes that read back as the answer to that very
// question, the proxy's own upstream request for its name reads back as the same question, and a
// refusal always says why. Seed corpus: tests/fuzz/corpus/dns_message/.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "protocols/dns_message.hpp"

namespace {

using namespace rlm::protocols;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

// The response to `query` reads back, through the upstream answer parser, as an answer to it.
void check_response_reads_back(const DnsQuery& query) {
  std::string why;
  const std::string host = "pypi.org";
  const auto a = build_dns_response(query, DnsRcode::no_error,
                                    std::array<std::uint8_t, 4>{1, 2, 3, 4}, nullptr, 60);
  const auto ptr = build_dns_response(query, DnsRcode::no_error, std::nullopt, &host, 60);
  const auto nxdomain = build_dns_response(query, DnsRcode::name_error, std::nullopt, nullptr, 0);
  check(a.size() >= 12 && ptr.size() >= 12 && nxdomain.size() >= 12);
  if (query.question.klass != kDnsClassIn) return;  // the answer parser asks class IN only
  const std::string& name = query.question.name;
  const std::uint16_t type = query.question.type;
  auto answer = parse_dns_answer(a, query.id, name, type, why);
  check(answer.has_value());
  check(answer->addresses.size() == (type == kDnsTypeA ? 1u : 0u));
  if (type == kDnsTypeA) check(answer->addresses[0][3] == 4 && answer->min_ttl == 60);
  check(parse_dns_answer(ptr, query.id, name, type, why).has_value());
  answer = parse_dns_answer(nxdomain, query.id, name, type, why);
  check(answer.has_value() && answer->addresses.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> message(data, size);
  std::string why;
  std::optional<std::uint16_t> id;
  const auto query = parse_dns_query(message, why, &id);
  check(query.has_value() || !why.empty());
  check(id.has_value() == (size >= 12));
  if (query) {
    check(*id == query->id);
    check_response_reads_back(*query);
    // What the proxy would ask upstream for the same name is that question again.
    const auto request = build_dns_request(query->id, query->question.name, query->question.type);
    const auto asked = parse_dns_query(request, why);
    check(asked.has_value() && asked->question.name == query->question.name &&
          asked->question.type == query->question.type);
  }

  // The same bytes as the upstream's answer to a fixed question, the id taken from the bytes so
  // that the parse gets past it.
  const std::uint16_t answer_id =
      size >= 2 ? static_cast<std::uint16_t>(data[0] << 8 | data[1]) : 0;
  for (std::uint16_t type : {kDnsTypeA, kDnsTypeAaaa}) {
    const auto answer = parse_dns_answer(message, answer_id, "pypi.org", type, why);
    check(answer.has_value() || !why.empty());
    if (answer && answer->addresses.empty()) check(answer->min_ttl == 0);
  }
  return 0;
}
