// DNS messages (RFC 1035) as the egress proxy meets them: a sandbox's query, read from hostile
// bytes, and the answer the host side writes back; a query to the upstream resolver and its
// answer's addresses. Pure functions over bytes: no sockets, no allocation beyond the results.
// Every read is bounded by the message; name compression is followed at most kMaxPointers times
// and only backwards, so no message makes a parser loop.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rlm::protocols {

constexpr std::uint16_t kDnsTypeA = 1, kDnsTypePtr = 12, kDnsTypeAaaa = 28;
constexpr std::uint16_t kDnsClassIn = 1;
constexpr std::size_t kDnsMaxMessage = 65535;

enum class DnsRcode : std::uint8_t {
  no_error = 0,
  format_error = 1,
  server_failure = 2,
  name_error = 3,
  not_implemented = 4,
  refused = 5
};

struct DnsQuestion {
  std::string name;  // lowercase, no trailing dot, labels joined by '.'; "" is the root
  std::uint16_t type = 0;
  std::uint16_t klass = 0;
};

struct DnsQuery {
  std::uint16_t id = 0;
  bool recursion_desired = false;
  DnsQuestion question;
  bool has_edns = false;  // an OPT record in the additional section
};

// One query: QR = 0, opcode QUERY, exactly one question, no answers or authority records (an
// OPT in additional is accepted). Names: labels of 1..63 bytes, at most 255 bytes in all; bytes
// are kept as they are except A-Z, which are lowercased (a label holding a '.' is refused: its
// text would read as two labels). nullopt with `why` for anything else;
// `id_out` gets the message id whenever the header could be read (so a FORMERR can be answered).
std::optional<DnsQuery> parse_dns_query(std::span<const std::uint8_t> message, std::string& why,
                                        std::optional<std::uint16_t>* id_out = nullptr);

// The answer to `query`: the question echoed, QR, RA, RD as asked, AA set, `rcode`, and
//   - `ipv4` set: one A record (query type A) with `ttl`;
//   - `ptr_name` set: one PTR record naming it (query type PTR);
//   - neither: no records (NODATA with no_error, NXDOMAIN with name_error, ...).
// A record of a type the query did not ask is left out (NODATA). No EDNS in the answer. Throws
// nothing; a name the query carried always re-encodes (a `ptr_name` that is not a name gives
// SERVFAIL with no record).
std::vector<std::uint8_t> build_dns_response(const DnsQuery& query, DnsRcode rcode,
                                             std::optional<std::array<std::uint8_t, 4>> ipv4,
                                             const std::string* ptr_name, std::uint32_t ttl);

// A bare header answer for a message that was not a query we take: id echoed, QR, `rcode`,
// no question.
std::vector<std::uint8_t> build_dns_error(std::uint16_t id, DnsRcode rcode);

// A recursive query (RD) for `name` (lowercase, no trailing dot) and `type`, to the upstream;
// empty when `name` is not a name (an empty label, one over 63 bytes, over 255 in all).
std::vector<std::uint8_t> build_dns_request(std::uint16_t id, const std::string& name,
                                            std::uint16_t type);

// The upstream's answer to build_dns_request(id, name, type): the addresses of every record
// of `type` (A: 4 bytes, AAAA: 16) in the answer section, following CNAMEs within the message
// (a record counts when its owner is `name` or a name the chain reached). nullopt with `why`
// when the message is malformed, is not the answer to that id and question, or its rcode is not
// no_error/name_error (name_error: an empty vector).
struct DnsAddresses {
  std::vector<std::array<std::uint8_t, 16>> addresses;  // IPv4 in the first 4 bytes
  std::uint32_t min_ttl = 0;
};
std::optional<DnsAddresses> parse_dns_answer(std::span<const std::uint8_t> message,
                                             std::uint16_t id, const std::string& name,
                                             std::uint16_t type, std::string& why);

}  // namespace rlm::protocols
