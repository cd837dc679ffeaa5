// DNS messages as the egress proxy reads and writes them (runtime/protocols/dns_message.hpp):
// a sandbox's query from hand-made bytes, compression that loops, points forward or hops too
// often, truncation at every length, the answers the host writes (A, PTR, NXDOMAIN, NODATA) read
// back, and the upstream's answers with CNAME chains and with the wrong id or question.
#include "protocols/dns_message.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rlm::protocols {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Writes a DNS message field by field.
class Message {
 public:
  Message& u16(std::uint16_t value) {
    bytes_.push_back(static_cast<std::uint8_t>(value >> 8));
    bytes_.push_back(static_cast<std::uint8_t>(value));
    return *this;
  }
  Message& u32(std::uint32_t value) {
    return u16(static_cast<std::uint16_t>(value >> 16)).u16(static_cast<std::uint16_t>(value));
  }
  Message& header(std::uint16_t id, std::uint16_t flags, std::uint16_t questions,
                  std::uint16_t answers, std::uint16_t authorities = 0,
                  std::uint16_t additionals = 0) {
    return u16(id).u16(flags).u16(questions).u16(answers).u16(authorities).u16(additionals);
  }
  // Labels as given (case kept), then the root.
  Message& name(const std::string& dotted) {
    std::size_t start = 0;
    while (start < dotted.size()) {
      std::size_t dot = dotted.find('.', start);
      if (dot == std::string::npos) dot = dotted.size();
      bytes_.push_back(static_cast<std::uint8_t>(dot - start));
      bytes_.insert(bytes_.end(), dotted.begin() + static_cast<std::ptrdiff_t>(start),
                    dotted.begin() + static_cast<std::ptrdiff_t>(dot));
      start = dot + 1;
    }
    bytes_.push_back(0);
    return *this;
  }
  Message& pointer(std::uint16_t offset) {
    return u16(static_cast<std::uint16_t>(0xc000 | offset));
  }
  Message& raw(const Bytes& more) {
    bytes_.insert(bytes_.end(), more.begin(), more.end());
    return *this;
  }
  std::size_t size() const { return bytes_.size(); }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
};

constexpr std::uint16_t kQueryFlags = 0x0100;     // RD
constexpr std::uint16_t kResponseFlags = 0x8180;  // QR RD RA
constexpr std::uint16_t kCname = 5;

Bytes query_for(const std::string& name, std::uint16_t type = kDnsTypeA) {
  return Message().header(0x1234, kQueryFlags, 1, 0).name(name).u16(type).u16(kDnsClassIn).bytes();
}

DnsQuery parsed(const Bytes& message) {
  std::string why;
  auto query = parse_dns_query(message, why);
  EXPECT_TRUE(query) << why;
  return query.value_or(DnsQuery{});
}

std::string refusal(const Bytes& message) {
  std::string why;
  auto query = parse_dns_query(message, why);
  EXPECT_FALSE(query) << "accepted " << query->question.name;
  return why;
}

TEST(DnsQuery, AnAQueryForMixedCaseWithTheRootDotReadsLowercaseWithoutIt) {
  // "PyPI.org." on the wire is PyPI, org, root: the text form has no trailing dot.
  const DnsQuery query = parsed(query_for("PyPI.org"));
  EXPECT_EQ(query.id, 0x1234);
  EXPECT_TRUE(query.recursion_desired);
  EXPECT_EQ(query.question.name, "pypi.org");
  EXPECT_EQ(query.question.type, kDnsTypeA);
  EXPECT_EQ(query.question.klass, kDnsClassIn);
  EXPECT_FALSE(query.has_edns);
}

TEST(DnsQuery, AQueryWithEdnsAsDigSendsItIsTaken) {
  // dig pypi.org AAAA +noall: an OPT record (udp size 1232, DO clear, a cookie option).
  const Bytes message = Message()
                            .header(0xbeef, 0x0120, 1, 0, 0, 1)
                            .name("pypi.org")
                            .u16(kDnsTypeAaaa)
                            .u16(kDnsClassIn)
                            .raw({0x00})  // root owner
                            .u16(41)
                            .u16(1232)
                            .u32(0)
                            .u16(12)
                            .raw({0x00, 0x0a, 0x00, 0x08, 1, 2, 3, 4, 5, 6, 7, 8})
                            .bytes();
  const DnsQuery query = parsed(message);
  EXPECT_EQ(query.question.name, "pypi.org");
  EXPECT_EQ(query.question.type, kDnsTypeAaaa);
  EXPECT_TRUE(query.has_edns);
}

TEST(DnsQuery, TheRootItselfIsTheEmptyName) {
  EXPECT_EQ(parsed(Message().header(1, 0, 1, 0).raw({0}).u16(2).u16(1).bytes()).question.name, "");
}

TEST(DnsQuery, BytesOtherThanLettersAreKeptAsTheyAre) {
  const Bytes message =
      Message().header(1, 0, 1, 0).raw({3, 'a', 0x00, 0xff, 2, '_', '-', 0}).u16(1).u16(1).bytes();
  EXPECT_EQ(parsed(message).question.name, std::string("a\0\xff._-", 6));
}

TEST(DnsQuery, WhatIsNotOneQueryIsRefusedWithTheIdStillRead) {
  std::string why;
  std::optional<std::uint16_t> id;
  Bytes response = query_for("pypi.org");
  response[2] |= 0x80;
  EXPECT_FALSE(parse_dns_query(response, why, &id));
  EXPECT_EQ(why, "a response, not a query");
  EXPECT_EQ(id, 0x1234) << "the id of a refused message, for its FORMERR";

  Bytes notify = query_for("pypi.org");
  notify[2] |= 4 << 3;  // opcode NOTIFY
  EXPECT_EQ(refusal(notify), "opcode 4, not QUERY");

  EXPECT_EQ(
      refusal(Message().header(1, 0, 2, 0).name("a").u16(1).u16(1).name("b").u16(1).u16(1).bytes()),
      "2 questions, not one");
  EXPECT_EQ(refusal(Message().header(1, 0, 0, 0).bytes()), "0 questions, not one");
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 1).name("a").u16(1).u16(1).bytes()),
            "answer or authority records in a query");
  // An additional record that is not OPT, and two OPTs.
  EXPECT_EQ(refusal(Message()
                        .header(1, 0, 1, 0, 0, 1)
                        .name("a")
                        .u16(1)
                        .u16(1)
                        .raw({0})
                        .u16(1)
                        .u16(1)
                        .u32(0)
                        .u16(0)
                        .bytes()),
            "an additional record other than OPT");
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 0, 0, 2).name("a").u16(1).u16(1).bytes()),
            "more additional records than one OPT");
  EXPECT_EQ(refusal(Message().raw(query_for("a")).raw({0}).bytes()), "bytes after the last record");
}

TEST(DnsQuery, EveryTruncationOfAQueryIsRefused) {
  const Bytes whole = Message()
                          .header(7, kQueryFlags, 1, 0, 0, 1)
                          .name("files.pythonhosted.org")
                          .u16(kDnsTypeA)
                          .u16(kDnsClassIn)
                          .raw({0})
                          .u16(41)
                          .u16(4096)
                          .u32(0)
                          .u16(4)
                          .raw({0, 0, 0, 0})
                          .bytes();
  parsed(whole);
  for (std::size_t length = 0; length < whole.size(); ++length) {
    std::string why;
    std::optional<std::uint16_t> id;
    EXPECT_FALSE(parse_dns_query(std::span(whole).first(length), why, &id)) << length;
    EXPECT_FALSE(why.empty());
    EXPECT_EQ(id.has_value(), length >= 12) << length;
  }
}

TEST(DnsQuery, NamesPastTheLimitsAreRefused) {
  // 63 is the longest label; a length byte of 64 (0x40) is no label type at all.
  parsed(query_for(std::string(63, 'a') + ".org"));
  EXPECT_EQ(refusal(Message()
                        .header(1, 0, 1, 0)
                        .raw({64})
                        .raw(Bytes(64, 'a'))
                        .raw({0})
                        .u16(1)
                        .u16(1)
                        .bytes()),
            "a label type other than a plain label or a pointer");
  // 255 bytes on the wire in all: four labels of 63 (4 * 64) and the root are 257.
  std::string longest = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                        std::string(63, 'c') + "." + std::string(61, 'd');
  EXPECT_EQ(parsed(query_for(longest)).question.name, longest);
  EXPECT_EQ(refusal(query_for(longest + "d")), "a name longer than 255 bytes");
  // A dot inside a label would read as two labels.
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 0).raw({3, 'a', '.', 'b', 0}).u16(1).u16(1).bytes()),
            "a label holding a '.'");
}

TEST(DnsQuery, CompressionThatLoopsOrPointsForwardIsRefused) {
  // The question's name a pointer to itself: the shortest loop.
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 0).pointer(12).u16(1).u16(1).bytes()),
            "a compression pointer that does not point backwards");
  // A label, then a pointer back to that label: a loop through one label.
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 0).raw({1, 'a'}).pointer(12).u16(1).u16(1).bytes()),
            "a compression pointer that does not point backwards");
  // A pointer forward, to a real name after the question.
  EXPECT_EQ(
      refusal(Message().header(1, 0, 1, 0).pointer(18).u16(1).u16(1).name("pypi.org").bytes()),
      "a compression pointer that does not point backwards");
  // A pointer cut in half by the end of the message.
  EXPECT_EQ(refusal(Message().header(1, 0, 1, 0).raw({0xc0}).bytes()),
            "a compression pointer runs past the end of the message");
}

TEST(DnsQuery, APointerBackIntoTheHeaderIsFollowedThere) {
  // Legal, if odd: the header's bytes 10..11 (arcount 0, 0) read as the root name.
  EXPECT_EQ(parsed(Message().header(1, 0, 1, 0).pointer(10).u16(1).u16(1).bytes()).question.name,
            "");
}

TEST(DnsResponse, AnAAnswerReadsBackAsTheAddressItHolds) {
  const DnsQuery query = parsed(query_for("PyPI.org"));
  const Bytes response = build_dns_response(query, DnsRcode::no_error,
                                            std::array<std::uint8_t, 4>{10, 0, 0, 7}, nullptr, 30);
  // Header: id, QR AA RD RA, one question, one answer; the question echoed lowercased.
  const Bytes expected = Message()
                             .header(0x1234, 0x8580, 1, 1)
                             .name("pypi.org")
                             .u16(kDnsTypeA)
                             .u16(kDnsClassIn)
                             .pointer(12)
                             .u16(kDnsTypeA)
                             .u16(kDnsClassIn)
                             .u32(30)
                             .u16(4)
                             .raw({10, 0, 0, 7})
                             .bytes();
  EXPECT_EQ(response, expected);
  std::string why;
  auto answer = parse_dns_answer(response, 0x1234, "pypi.org", kDnsTypeA, why);
  ASSERT_TRUE(answer) << why;
  ASSERT_EQ(answer->addresses.size(), 1u);
  EXPECT_EQ(answer->addresses[0][0], 10);
  EXPECT_EQ(answer->addresses[0][3], 7);
  EXPECT_EQ(answer->min_ttl, 30u);
}

TEST(DnsResponse, NxdomainAndNodataHoldTheQuestionAndNoRecord) {
  DnsQuery query = parsed(query_for("evil.test", kDnsTypeAaaa));
  const Bytes nxdomain = build_dns_response(query, DnsRcode::name_error, std::nullopt, nullptr, 0);
  EXPECT_EQ(nxdomain, Message()
                          .header(0x1234, 0x8583, 1, 0)
                          .name("evil.test")
                          .u16(kDnsTypeAaaa)
                          .u16(kDnsClassIn)
                          .bytes());
  std::string why;
  auto answer = parse_dns_answer(nxdomain, 0x1234, "evil.test", kDnsTypeAaaa, why);
  ASSERT_TRUE(answer) << why;
  EXPECT_TRUE(answer->addresses.empty());

  // NODATA: an AAAA question the proxy has only an IPv4 answer for gets no record, not an A.
  const Bytes nodata = build_dns_response(query, DnsRcode::no_error,
                                          std::array<std::uint8_t, 4>{10, 0, 0, 7}, nullptr, 30);
  EXPECT_EQ(nodata, Message()
                        .header(0x1234, 0x8580, 1, 0)
                        .name("evil.test")
                        .u16(kDnsTypeAaaa)
                        .u16(kDnsClassIn)
                        .bytes());
  answer = parse_dns_answer(nodata, 0x1234, "evil.test", kDnsTypeAaaa, why);
  ASSERT_TRUE(answer) << why;
  EXPECT_TRUE(answer->addresses.empty());

  query.recursion_desired = false;
  EXPECT_EQ(build_dns_response(query, DnsRcode::refused, std::nullopt, nullptr, 0)[3], 0x85)
      << "RD echoed as asked (clear), RA set, rcode REFUSED";
}

TEST(DnsResponse, APtrAnswerNamesTheHost) {
  const DnsQuery query = parsed(query_for("7.0.0.10.in-addr.arpa", kDnsTypePtr));
  const std::string host = "pypi.org";
  EXPECT_EQ(build_dns_response(query, DnsRcode::no_error, std::nullopt, &host, 60),
            Message()
                .header(0x1234, 0x8580, 1, 1)
                .name("7.0.0.10.in-addr.arpa")
                .u16(kDnsTypePtr)
                .u16(kDnsClassIn)
                .pointer(12)
                .u16(kDnsTypePtr)
                .u16(kDnsClassIn)
                .u32(60)
                .u16(10)
                .name("pypi.org")
                .bytes());
  // A name that cannot be written is not claimed: SERVFAIL, no record.
  const std::string bad = "a..b";
  const Bytes failed = build_dns_response(query, DnsRcode::no_error, std::nullopt, &bad, 60);
  EXPECT_EQ(failed[3] & 0x0f, 2);
  EXPECT_EQ(failed[7], 0);
}

TEST(DnsResponse, AnErrorIsABareHeader) {
  EXPECT_EQ(build_dns_error(0xabcd, DnsRcode::format_error),
            Message().header(0xabcd, 0x8001, 0, 0).bytes());
}

// The upstream's answer to www.pypi.org A: a CNAME to a name compressed against the question,
// that name's A records, and records of names outside the chain.
Bytes chained_answer(bool records_reversed) {
  Message message;
  message.header(0x4242, kResponseFlags, 1, 4).name("www.pypi.org").u16(kDnsTypeA).u16(kDnsClassIn);
  const auto cname = [&] {
    // dualstack + pointer to "pypi.org" (offset 12 + 4 for "\3www").
    message.pointer(12).u16(kCname).u16(kDnsClassIn).u32(300).u16(12);
    message.raw({9, 'd', 'u', 'a', 'l', 's', 't', 'a', 'c', 'k'}).pointer(16);
  };
  const auto addresses = [&] {
    message.name("DualStack.pypi.org")
        .u16(kDnsTypeA)
        .u16(kDnsClassIn)
        .u32(60)
        .u16(4)
        .raw({151, 101, 0, 223});
    message.name("dualstack.pypi.org")
        .u16(kDnsTypeA)
        .u16(kDnsClassIn)
        .u32(90)
        .u16(4)
        .raw({151, 101, 64, 223});
    message.name("elsewhere.test").u16(kDnsTypeA).u16(kDnsClassIn).u32(5).u16(4).raw({6, 6, 6, 6});
  };
  if (records_reversed) {
    addresses();
    // The CNAME's owner as a pointer to the question still.
    cname();
  } else {
    cname();
    addresses();
  }
  return message.bytes();
}

TEST(DnsUpstream, TheRequestIsOneRecursiveQuestion) {
  const Bytes request = build_dns_request(0x4242, "www.pypi.org", kDnsTypeA);
  EXPECT_EQ(request, Message()
                         .header(0x4242, kQueryFlags, 1, 0)
                         .name("www.pypi.org")
                         .u16(kDnsTypeA)
                         .u16(kDnsClassIn)
                         .bytes());
  const DnsQuery query = parsed(request);
  EXPECT_EQ(query.question.name, "www.pypi.org");
  EXPECT_TRUE(build_dns_request(1, "a..b", kDnsTypeA).empty()) << "not a name: nothing to send";
}

TEST(DnsUpstream, ACnameChainIsFollowedInAnyOrderAndOnlyItsAddressesCount) {
  for (bool reversed : {false, true}) {
    std::string why;
    auto answer =
        parse_dns_answer(chained_answer(reversed), 0x4242, "www.pypi.org", kDnsTypeA, why);
    ASSERT_TRUE(answer) << why;
    ASSERT_EQ(answer->addresses.size(), 2u) << "not elsewhere.test's";
    EXPECT_EQ(answer->addresses[0][0], 151);
    EXPECT_EQ(answer->addresses[0][2], 0);
    EXPECT_EQ(answer->addresses[1][2], 64);
    EXPECT_EQ(answer->min_ttl, 60u);
  }
}

TEST(DnsUpstream, AnAnswerToAnotherIdOrQuestionIsRefused) {
  const Bytes answer = chained_answer(false);
  std::string why;
  EXPECT_FALSE(parse_dns_answer(answer, 0x4243, "www.pypi.org", kDnsTypeA, why));
  EXPECT_EQ(why, "id 16962, not the query's 16963");
  EXPECT_FALSE(parse_dns_answer(answer, 0x4242, "pypi.org", kDnsTypeA, why));
  EXPECT_EQ(why, "the answer is to another question");
  EXPECT_FALSE(parse_dns_answer(answer, 0x4242, "www.pypi.org", kDnsTypeAaaa, why));
  EXPECT_EQ(why, "the answer is to another question");
  // The question's case does not matter (0x20 randomization).
  EXPECT_TRUE(parse_dns_answer(answer, 0x4242, "WWW.pypi.org", kDnsTypeA, why)) << why;

  Bytes servfail = answer;
  servfail[3] = (servfail[3] & 0xf0) | 2;
  EXPECT_FALSE(parse_dns_answer(servfail, 0x4242, "www.pypi.org", kDnsTypeA, why));
  EXPECT_EQ(why, "the resolver answered rcode 2");
  Bytes truncated = answer;
  truncated[2] |= 0x02;
  EXPECT_FALSE(parse_dns_answer(truncated, 0x4242, "www.pypi.org", kDnsTypeA, why));
  Bytes query = answer;
  query[2] &= 0x7f;
  EXPECT_FALSE(parse_dns_answer(query, 0x4242, "www.pypi.org", kDnsTypeA, why));
  EXPECT_EQ(why, "not a response to a QUERY");
}

TEST(DnsUpstream, EveryTruncationOfAnAnswerIsRefused) {
  const Bytes whole = chained_answer(false);
  for (std::size_t length = 0; length < whole.size(); ++length) {
    std::string why;
    EXPECT_FALSE(
        parse_dns_answer(std::span(whole).first(length), 0x4242, "www.pypi.org", kDnsTypeA, why))
        << length;
  }
}

TEST(DnsUpstream, AnAddressOfTheWrongSizeIsRefused) {
  const Bytes answer = Message()
                           .header(9, kResponseFlags, 1, 1)
                           .name("a.test")
                           .u16(kDnsTypeAaaa)
                           .u16(kDnsClassIn)
                           .pointer(12)
                           .u16(kDnsTypeAaaa)
                           .u16(kDnsClassIn)
                           .u32(1)
                           .u16(4)
                           .raw({1, 2, 3, 4})
                           .bytes();
  std::string why;
  EXPECT_FALSE(parse_dns_answer(answer, 9, "a.test", kDnsTypeAaaa, why));
  EXPECT_EQ(why, "an address record of 4 bytes");
}

// An answer whose second record's owner reaches the question through `hops` pointers: the first
// record's data is a ladder of pointers, each to the one before, the first to the question.
Bytes answer_through_pointers(int hops) {
  Message message;
  message.header(5, kResponseFlags, 1, 2).name("a.test").u16(kDnsTypeA).u16(kDnsClassIn);
  const int ladder = hops - 1;  // the owner's own pointer is one hop
  message.pointer(12).u16(99).u16(kDnsClassIn).u32(1).u16(static_cast<std::uint16_t>(2 * ladder));
  std::size_t rung = message.size();
  message.pointer(12);
  for (int i = 1; i < ladder; ++i) {
    message.pointer(static_cast<std::uint16_t>(rung));
    rung += 2;
  }
  message.pointer(static_cast<std::uint16_t>(rung))
      .u16(kDnsTypeA)
      .u16(kDnsClassIn)
      .u32(1)
      .u16(4)
      .raw({1, 2, 3, 4});
  return message.bytes();
}

TEST(DnsUpstream, ANameFollowsAtMostSixteenPointers) {
  std::string why;
  auto answer = parse_dns_answer(answer_through_pointers(16), 5, "a.test", kDnsTypeA, why);
  ASSERT_TRUE(answer) << why;
  EXPECT_EQ(answer->addresses.size(), 1u);
  EXPECT_FALSE(parse_dns_answer(answer_through_pointers(17), 5, "a.test", kDnsTypeA, why));
  EXPECT_EQ(why, "a name with more than 16 compression pointers");
}

TEST(DnsUpstream, ACnameWithBytesAfterItsNameIsRefused) {
  const Bytes answer = Message()
                           .header(9, kResponseFlags, 1, 1)
                           .name("a.test")
                           .u16(kDnsTypeA)
                           .u16(kDnsClassIn)
                           .pointer(12)
                           .u16(kCname)
                           .u16(kDnsClassIn)
                           .u32(1)
                           .u16(3)
                           .pointer(12)
                           .raw({0})
                           .bytes();
  std::string why;
  EXPECT_FALSE(parse_dns_answer(answer, 9, "a.test", kDnsTypeA, why));
  EXPECT_EQ(why, "a CNAME record with bytes after its name");
}

}  // namespace
}  // namespace rlm::protocols
