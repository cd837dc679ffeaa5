#include "protocols/dns_message.hpp"

#include <algorithm>
#include <limits>
#include <string_view>

namespace rlm::protocols {
namespace {

// A name may hop through at most this many compression pointers. Each must point before the
// last one (so no loop is possible anyway); the cap bounds the work a name of hops costs.
constexpr int kMaxPointers = 16;
constexpr std::size_t kMaxNameBytes = 255;  // on the wire: length bytes, labels, the root byte
constexpr std::size_t kMaxLabel = 63;
constexpr std::size_t kHeaderBytes = 12;
constexpr std::size_t kRecordFixedBytes = 10;  // type, class, ttl, rdlength
constexpr std::uint16_t kDnsTypeCname = 5, kDnsTypeOpt = 41;
// CNAME hops followed from the asked name; resolvers give up well before a chain this long.
constexpr int kMaxCnameHops = 16;
// Answers are built with the owner as a pointer to the question's name, right after the header.
constexpr std::uint16_t kPointerToQuestion = 0xc000 | kHeaderBytes;

constexpr std::uint16_t kFlagResponse = 0x8000, kFlagAuthoritative = 0x0400,
                        kFlagTruncated = 0x0200, kFlagRecursionDesired = 0x0100,
                        kFlagRecursionAvailable = 0x0080;

struct Header {
  std::uint16_t id, flags, questions, answers, authorities, additionals;
  int opcode() const { return (flags >> 11) & 0xf; }
  int rcode() const { return flags & 0xf; }
};

std::uint16_t read_u16(std::span<const std::uint8_t> bytes, std::size_t at) {
  return static_cast<std::uint16_t>(bytes[at] << 8 | bytes[at + 1]);
}

std::uint32_t read_u32(std::span<const std::uint8_t> bytes, std::size_t at) {
  return std::uint32_t{read_u16(bytes, at)} << 16 | read_u16(bytes, at + 2);
}

Header read_header(std::span<const std::uint8_t> message) {  // message: >= kHeaderBytes
  return {read_u16(message, 0), read_u16(message, 2), read_u16(message, 4),
          read_u16(message, 6), read_u16(message, 8), read_u16(message, 10)};
}

void put_u16(std::vector<std::uint8_t>& out, std::uint16_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 8));
  out.push_back(static_cast<std::uint8_t>(value));
}

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t value) {
  put_u16(out, static_cast<std::uint16_t>(value >> 16));
  put_u16(out, static_cast<std::uint16_t>(value));
}

void put_header(std::vector<std::uint8_t>& out, const Header& header) {
  for (std::uint16_t field : {header.id, header.flags, header.questions, header.answers,
                              header.authorities, header.additionals})
    put_u16(out, field);
}

// Reads the (possibly compressed) name at `at` into `name` (DnsQuestion's form). Returns where
// the name ends in the message (after its first pointer, if any), or nullopt with `why`. A
// pointer must point before the label run it ends, so the positions read only ever go down.
std::optional<std::size_t> read_name(std::span<const std::uint8_t> message, std::size_t at,
                                     std::string& name, std::string& why) {
  name.clear();
  std::optional<std::size_t> end;
  std::size_t run_start = at, wire_bytes = 1;  // the root byte
  int pointers = 0;
  for (;;) {
    if (at >= message.size()) {
      why = "a name runs past the end of the message";
      return std::nullopt;
    }
    const std::uint8_t length = message[at];
    if ((length & 0xc0) == 0xc0) {
      if (at + 1 >= message.size()) {
        why = "a compression pointer runs past the end of the message";
        return std::nullopt;
      }
      const std::size_t target = std::size_t{read_u16(message, at)} & 0x3fff;
      if (target >= run_start) {
        why = "a compression pointer that does not point backwards";
        return std::nullopt;
      }
      if (++pointers > kMaxPointers) {
        why = "a name with more than " + std::to_string(kMaxPointers) + " compression pointers";
        return std::nullopt;
      }
      if (!end) end = at + 2;
      at = run_start = target;
      continue;
    }
    if (length & 0xc0) {
      why = "a label type other than a plain label or a pointer";
      return std::nullopt;
    }
    if (length == 0) break;
    wire_bytes += 1 + length;
    if (wire_bytes > kMaxNameBytes) {
      why = "a name longer than 255 bytes";
      return std::nullopt;
    }
    if (length > message.size() - at - 1) {
      why = "a label runs past the end of the message";
      return std::nullopt;
    }
    if (!name.empty()) name.push_back('.');
    for (std::uint8_t c : message.subspan(at + 1, length)) {
      // A dot inside a label would make the text name say something else than the wire one.
      if (c == '.') {
        why = "a label holding a '.'";
        return std::nullopt;
      }
      name.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
    }
    at += 1 + length;
  }
  return end ? *end : at + 1;
}

// `name` (DnsQuestion's form) on the wire, uncompressed; false when it is not a name.
bool put_name(std::vector<std::uint8_t>& out, std::string_view name) {
  if (name.empty()) {
    out.push_back(0);
    return true;
  }
  if (name.size() + 2 > kMaxNameBytes) return false;  // the first length byte and the root
  for (;;) {
    const std::size_t dot = name.find('.');
    const std::string_view label = name.substr(0, dot);
    if (label.empty() || label.size() > kMaxLabel) return false;
    out.push_back(static_cast<std::uint8_t>(label.size()));
    out.insert(out.end(), label.begin(), label.end());
    if (dot == std::string_view::npos) break;
    name.remove_prefix(dot + 1);
  }
  out.push_back(0);
  return true;
}

std::uint32_t bounded_ttl(std::uint32_t ttl) {  // RFC 2181 8: a TTL is at most 2^31 - 1
  return std::min<std::uint32_t>(ttl, std::numeric_limits<std::int32_t>::max());
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

std::optional<DnsQuery> parse_dns_query(std::span<const std::uint8_t> message, std::string& why,
                                        std::optional<std::uint16_t>* id_out) {
  if (message.size() < kHeaderBytes) {
    why = "shorter than a DNS header";
    return std::nullopt;
  }
  const Header header = read_header(message);
  if (id_out) *id_out = header.id;
  if (message.size() > kDnsMaxMessage) {
    why = "longer than a DNS message can be";
    return std::nullopt;
  }
  if (header.flags & kFlagResponse) {
    why = "a response, not a query";
    return std::nullopt;
  }
  if (header.opcode() != 0) {
    why = "opcode " + std::to_string(header.opcode()) + ", not QUERY";
    return std::nullopt;
  }
  if (header.questions != 1) {
    why = std::to_string(header.questions) + " questions, not one";
    return std::nullopt;
  }
  if (header.answers != 0 || header.authorities != 0) {
    why = "answer or authority records in a query";
    return std::nullopt;
  }
  if (header.additionals > 1) {
    why = "more additional records than one OPT";
    return std::nullopt;
  }

  DnsQuery query;
  query.id = header.id;
  query.recursion_desired = header.flags & kFlagRecursionDesired;
  auto at = read_name(message, kHeaderBytes, query.question.name, why);
  if (!at) return std::nullopt;
  if (message.size() - *at < 4) {
    why = "the question's type and class run past the end of the message";
    return std::nullopt;
  }
  query.question.type = read_u16(message, *at);
  query.question.klass = read_u16(message, *at + 2);
  *at += 4;

  if (header.additionals == 1) {
    std::string owner;
    at = read_name(message, *at, owner, why);
    if (!at) return std::nullopt;
    if (message.size() - *at < kRecordFixedBytes) {
      why = "the additional record runs past the end of the message";
      return std::nullopt;
    }
    if (!owner.empty() || read_u16(message, *at) != kDnsTypeOpt) {
      why = "an additional record other than OPT";
      return std::nullopt;
    }
    const std::size_t data_bytes = read_u16(message, *at + 8);
    *at += kRecordFixedBytes;
    if (message.size() - *at < data_bytes) {
      why = "the OPT record's data runs past the end of the message";
      return std::nullopt;
    }
    *at += data_bytes;
    query.has_edns = true;
  }
  if (*at != message.size()) {
    why = "bytes after the last record";
    return std::nullopt;
  }
  return query;
}

std::vector<std::uint8_t> build_dns_response(const DnsQuery& query, DnsRcode rcode,
                                             std::optional<std::array<std::uint8_t, 4>> ipv4,
                                             const std::string* ptr_name, std::uint32_t ttl) {
  std::vector<std::uint8_t> question;
  if (!put_name(question, query.question.name))  // only a DnsQuery not made by parse_dns_query
    return build_dns_error(query.id, DnsRcode::server_failure);
  put_u16(question, query.question.type);
  put_u16(question, query.question.klass);

  // A record only of the type asked for: an A record never answers an AAAA question.
  std::vector<std::uint8_t> record;
  if (ipv4 && query.question.type == kDnsTypeA) {
    put_u16(record, kPointerToQuestion);
    put_u16(record, kDnsTypeA);
    put_u16(record, kDnsClassIn);
    put_u32(record, bounded_ttl(ttl));
    put_u16(record, 4);
    record.insert(record.end(), ipv4->begin(), ipv4->end());
  } else if (ptr_name && !ipv4 && query.question.type == kDnsTypePtr) {
    std::vector<std::uint8_t> target;
    if (!put_name(target, *ptr_name)) {
      rcode = DnsRcode::server_failure;  // the caller's name is not one: say so, claim nothing
    } else {
      put_u16(record, kPointerToQuestion);
      put_u16(record, kDnsTypePtr);
      put_u16(record, kDnsClassIn);
      put_u32(record, bounded_ttl(ttl));
      put_u16(record, static_cast<std::uint16_t>(target.size()));
      record.insert(record.end(), target.begin(), target.end());
    }
  }

  std::vector<std::uint8_t> out;
  out.reserve(kHeaderBytes + question.size() + record.size());
  const auto flags = static_cast<std::uint16_t>(
      kFlagResponse | kFlagAuthoritative | kFlagRecursionAvailable |
      (query.recursion_desired ? kFlagRecursionDesired : 0) | static_cast<std::uint16_t>(rcode));
  put_header(out, {query.id, flags, 1, static_cast<std::uint16_t>(record.empty() ? 0 : 1), 0, 0});
  out.insert(out.end(), question.begin(), question.end());
  out.insert(out.end(), record.begin(), record.end());
  return out;
}

std::vector<std::uint8_t> build_dns_error(std::uint16_t id, DnsRcode rcode) {
  std::vector<std::uint8_t> out;
  const auto flags = static_cast<std::uint16_t>(kFlagResponse | static_cast<std::uint16_t>(rcode));
  put_header(out, {id, flags, 0, 0, 0, 0});
  return out;
}

std::vector<std::uint8_t> build_dns_request(std::uint16_t id, const std::string& name,
                                            std::uint16_t type) {
  std::vector<std::uint8_t> out;
  put_header(out, {id, kFlagRecursionDesired, 1, 0, 0, 0});
  if (!put_name(out, name)) return {};  // not a name: nothing to send
  put_u16(out, type);
  put_u16(out, kDnsClassIn);
  return out;
}

std::optional<DnsAddresses> parse_dns_answer(std::span<const std::uint8_t> message,
                                             std::uint16_t id, const std::string& name,
                                             std::uint16_t type, std::string& why) {
  if (message.size() < kHeaderBytes) {
    why = "shorter than a DNS header";
    return std::nullopt;
  }
  if (message.size() > kDnsMaxMessage) {
    why = "longer than a DNS message can be";
    return std::nullopt;
  }
  const Header header = read_header(message);
  if (header.id != id) {
    why = "id " + std::to_string(header.id) + ", not the query's " + std::to_string(id);
    return std::nullopt;
  }
  if (!(header.flags & kFlagResponse) || header.opcode() != 0) {
    why = "not a response to a QUERY";
    return std::nullopt;
  }
  if (header.flags & kFlagTruncated) {
    why = "truncated (TC): the answer did not fit";
    return std::nullopt;
  }
  if (header.rcode() != static_cast<int>(DnsRcode::no_error) &&
      header.rcode() != static_cast<int>(DnsRcode::name_error)) {
    why = "the resolver answered rcode " + std::to_string(header.rcode());
    return std::nullopt;
  }
  if (header.questions != 1) {
    why = std::to_string(header.questions) + " questions, not one";
    return std::nullopt;
  }
  const std::string asked = lowercase(name);
  std::string question;
  auto at = read_name(message, kHeaderBytes, question, why);
  if (!at) return std::nullopt;
  if (message.size() - *at < 4) {
    why = "the question's type and class run past the end of the message";
    return std::nullopt;
  }
  if (question != asked || read_u16(message, *at) != type ||
      read_u16(message, *at + 2) != kDnsClassIn) {
    why = "the answer is to another question";
    return std::nullopt;
  }
  *at += 4;
  DnsAddresses result;
  if (header.rcode() == static_cast<int>(DnsRcode::name_error)) return result;

  // The answer section read whole first: a chain's records may come in any order.
  struct Alias {
    std::string owner, target;
    std::uint32_t ttl;
  };
  struct Address {
    std::string owner;
    std::array<std::uint8_t, 16> bytes;
    std::uint32_t ttl;
  };
  std::vector<Alias> aliases;
  std::vector<Address> addresses;
  const std::size_t address_bytes = type == kDnsTypeAaaa ? 16 : type == kDnsTypeA ? 4 : 0;
  for (int i = 0; i < header.answers; ++i) {
    std::string owner;
    at = read_name(message, *at, owner, why);
    if (!at) return std::nullopt;
    if (message.size() - *at < kRecordFixedBytes) {
      why = "an answer record runs past the end of the message";
      return std::nullopt;
    }
    const std::uint16_t record_type = read_u16(message, *at);
    const std::uint16_t record_class = read_u16(message, *at + 2);
    // RFC 2181 8: a TTL with the top bit set counts as 0.
    std::uint32_t ttl = read_u32(message, *at + 4);
    if (ttl > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) ttl = 0;
    const std::size_t data_bytes = read_u16(message, *at + 8);
    const std::size_t data_at = *at + kRecordFixedBytes;
    if (message.size() - data_at < data_bytes) {
      why = "an answer record's data runs past the end of the message";
      return std::nullopt;
    }
    *at = data_at + data_bytes;
    if (record_class != kDnsClassIn) continue;
    if (record_type == kDnsTypeCname) {
      std::string target;
      // Pointers may reach back out of the record, but its own labels must fill it exactly.
      auto end = read_name(message.first(data_at + data_bytes), data_at, target, why);
      if (!end) return std::nullopt;
      if (*end != data_at + data_bytes) {
        why = "a CNAME record with bytes after its name";
        return std::nullopt;
      }
      aliases.push_back({std::move(owner), std::move(target), ttl});
    } else if (record_type == type && address_bytes != 0) {
      if (data_bytes != address_bytes) {
        why = "an address record of " + std::to_string(data_bytes) + " bytes";
        return std::nullopt;
      }
      Address address{std::move(owner), {}, ttl};
      std::copy_n(message.begin() + static_cast<std::ptrdiff_t>(data_at), address_bytes,
                  address.bytes.begin());
      addresses.push_back(std::move(address));
    }
  }

  // The chain from the asked name: a name has at most one CNAME, so it is a path.
  std::vector<std::string> chain{asked};
  std::uint32_t min_ttl = std::numeric_limits<std::uint32_t>::max();
  for (int hop = 0; hop < kMaxCnameHops; ++hop) {
    auto alias = std::find_if(aliases.begin(), aliases.end(),
                              [&](const Alias& a) { return a.owner == chain.back(); });
    if (alias == aliases.end() ||
        std::find(chain.begin(), chain.end(), alias->target) != chain.end())
      break;
    chain.push_back(alias->target);
    min_ttl = std::min(min_ttl, alias->ttl);
  }
  for (const Address& address : addresses) {
    if (std::find(chain.begin(), chain.end(), address.owner) == chain.end()) continue;
    result.addresses.push_back(address.bytes);
    min_ttl = std::min(min_ttl, address.ttl);
  }
  result.min_ttl = result.addresses.empty() ? 0 : min_ttl;
  return result;
}

}  // namespace rlm::protocols
