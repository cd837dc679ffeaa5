// HTTP/1.x requests as the egress proxy checks them (runtime/protocols/http_request.hpp): heads
// as clients send them and the ways a head could be read two ways (two Hosts, Content-Length
// with Transfer-Encoding, obs-fold, bare CR), proxy and tunnel forms, the head sent upstream, and
// bodies framed byte by byte so that a pipelined request after one is never taken for its body.
#include "protocols/http_request.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rlm::protocols {
namespace {

using Bytes = std::vector<std::uint8_t>;
using namespace std::string_literals;

Bytes bytes_of(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

constexpr std::size_t kMaxHead = 8192, kMaxHeaders = 64;

struct Parsed {
  HttpVerdict verdict;
  HttpRequestHead head;
  std::string why;
};

Parsed parse(std::string_view text, std::size_t max_head = kMaxHead,
             std::size_t max_headers = kMaxHeaders) {
  Parsed parsed;
  const Bytes bytes = bytes_of(text);
  parsed.verdict = parse_http_request_head(bytes, max_head, max_headers, parsed.head, parsed.why);
  return parsed;
}

HttpRequestHead complete(std::string_view text) {
  Parsed parsed = parse(text);
  EXPECT_EQ(parsed.verdict, HttpVerdict::complete) << parsed.why;
  return parsed.head;
}

std::string malformed(std::string_view text) {
  Parsed parsed = parse(text);
  EXPECT_EQ(parsed.verdict, HttpVerdict::malformed) << text;
  return parsed.why;
}

// What pip (urllib3) sends for an index page.
constexpr std::string_view kPipGet =
    "GET /simple/requests/ HTTP/1.1\r\n"
    "Host: PyPI.org\r\n"
    "User-Agent: pip/24.0 {\"python\":\"3.11.7\"}\r\n"
    "Accept-Encoding: gzip, deflate\r\n"
    "Accept: application/vnd.pypi.simple.v1+json; q=0.1, text/html; q=0.01\r\n"
    "Connection: keep-alive\r\n"
    "\r\n";

TEST(HttpRequestHead, ASimpleGetReadsWhole) {
  const HttpRequestHead head = complete(kPipGet);
  EXPECT_EQ(head.method, "GET");
  EXPECT_EQ(head.target, "/simple/requests/");
  EXPECT_EQ(head.version_minor, 1);
  EXPECT_EQ(head.host, "pypi.org");
  EXPECT_FALSE(head.host_port);
  EXPECT_FALSE(head.absolute_form);
  EXPECT_FALSE(head.upgrade);
  EXPECT_FALSE(head.connection_close);
  EXPECT_FALSE(head.chunked);
  EXPECT_EQ(head.content_length, 0u);
  EXPECT_EQ(head.head_bytes, kPipGet.size());
}

TEST(HttpRequestHead, EveryPrefixOfAHeadAsksForMore) {
  for (std::size_t length = 0; length < kPipGet.size(); ++length)
    EXPECT_EQ(parse(kPipGet.substr(0, length)).verdict, HttpVerdict::need_more) << length;
  // What follows the head is not part of it.
  EXPECT_EQ(complete(std::string(kPipGet) + "GET / HTTP/1.1\r\n").head_bytes, kPipGet.size());
}

TEST(HttpRequestHead, HostWithPortTrailingDotOrV6Literal) {
  HttpRequestHead head = complete("GET / HTTP/1.1\r\nHost: Deb.Debian.org.:8080\r\n\r\n");
  EXPECT_EQ(head.host, "deb.debian.org");
  EXPECT_EQ(head.host_port, 8080);
  head = complete("GET / HTTP/1.1\r\nHost:  [2001:DB8::1]:80 \r\n\r\n");
  EXPECT_EQ(head.host, "2001:db8::1");
  EXPECT_EQ(head.host_port, 80);
  head = complete("GET / HTTP/1.1\r\nHost: [::ffff:10.0.0.1]\r\n\r\n");
  EXPECT_EQ(head.host, "::ffff:10.0.0.1");
  EXPECT_FALSE(head.host_port);
  EXPECT_EQ(complete("GET / HTTP/1.0\r\nhost: 10.0.0.7\r\n\r\n").host, "10.0.0.7");

  for (const char* bad :
       {"pypi.org:", "pypi.org:65536", "pypi.org:8o", "pypi.org:80:80", "user@pypi.org",
        "pypi..org", "[2001:db8::1", "[pypi.org]:80", "[2001:db8::1]80", "pypi.org/", "py%70i.org"})
    EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: " + std::string(bad) + "\r\n\r\n"),
              "a Host that is not name[:port]")
        << bad;
}

TEST(HttpRequestHead, AnAbsentOrEmptyHostIsTheEmptyName) {
  EXPECT_EQ(complete("GET / HTTP/1.0\r\nAccept: */*\r\n\r\n").host, "");
  EXPECT_EQ(complete("GET / HTTP/1.1\r\nHost:\r\n\r\n").host, "");
}

TEST(HttpRequestHead, TwoHostsAreMalformedEvenWhenTheyAgree) {
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n"),
            "several Host headers");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: pypi.org\r\nhOST: pypi.org\r\n\r\n"),
            "several Host headers");
}

TEST(HttpRequestHead, ContentLengthEqualRepeatsOnlyAndNeverWithTransferEncoding) {
  EXPECT_EQ(complete("POST / HTTP/1.1\r\nContent-Length: 42\r\n\r\n").content_length, 42u);
  EXPECT_EQ(complete("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\ncontent-length: 005\r\n\r\n")
                .content_length,
            5u);
  EXPECT_EQ(malformed("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            "Content-Lengths that differ");
  EXPECT_EQ(malformed("POST / HTTP/1.1\r\nContent-Length: 5,6\r\n\r\n"),
            "Content-Lengths that differ");
  for (const char* bad : {"+5", "-1", "0x10", "5 5", "", "5,", "99999999999999999999"})
    EXPECT_EQ(malformed("POST / HTTP/1.1\r\nContent-Length: " + std::string(bad) + "\r\n\r\n"),
              "a Content-Length that is not a number")
        << bad;
  EXPECT_EQ(malformed("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "both Content-Length and Transfer-Encoding");
  EXPECT_EQ(malformed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"),
            "both Content-Length and Transfer-Encoding");
}

TEST(HttpRequestHead, TransferEncodingIsOneChunkedOrMalformed) {
  HttpRequestHead head = complete("POST / HTTP/1.1\r\nTransfer-Encoding:  ChUnKeD \t\r\n\r\n");
  EXPECT_TRUE(head.chunked);
  for (const char* bad : {"gzip", "gzip, chunked", "chunked, chunked", "chunked,", "identity",
                          "\"chunked\"", "chunked;q=1"})
    EXPECT_EQ(malformed("POST / HTTP/1.1\r\nTransfer-Encoding: " + std::string(bad) + "\r\n\r\n"),
              "a Transfer-Encoding other than one chunked")
        << bad;
  EXPECT_EQ(malformed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"),
            "a Transfer-Encoding other than one chunked");
  EXPECT_EQ(malformed("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "Transfer-Encoding in an HTTP/1.0 request");
}

TEST(HttpRequestHead, ObsFoldBareCrAndControlCharactersAreMalformed) {
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: pypi.org\r\nX-A: 1\r\n  folded\r\n\r\n"),
            "a folded header line (obs-fold)");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\n\tHost: pypi.org\r\n\r\n"),
            "a folded header line (obs-fold)");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: pypi.org\rX-Smuggle: 1\r\n\r\n"),
            "a CR not followed by LF");
  // Seen before the line ends: no need to wait for it.
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nHost: pypi.org\rX"), "a CR not followed by LF");
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: pypi.org\r").verdict, HttpVerdict::need_more);
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"s),
            "a control character in the value of X-A");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nX-A: a\x7f\r\n\r\n"),
            "a control character in the value of X-A");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nX-A : a\r\n\r\n"),
            "a header line that is not NAME: VALUE");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\nno colon\r\n\r\n"),
            "a header line that is not NAME: VALUE");
  EXPECT_EQ(malformed("GET / HTTP/1.1\r\n: empty\r\n\r\n"),
            "a header line that is not NAME: VALUE");
  // obs-text and tabs inside a value are fine.
  EXPECT_EQ(complete("GET / HTTP/1.1\r\nX-A: caf\xc3\xa9\tb\r\n\r\n").method, "GET");
}

TEST(HttpRequestHead, BareLfLineEndsAreAccepted) {
  const std::string_view text = "GET / HTTP/1.1\nHost: pypi.org\r\nAccept: */*\n\n";
  const HttpRequestHead head = complete(text);
  EXPECT_EQ(head.host, "pypi.org");
  EXPECT_EQ(head.head_bytes, text.size());
}

TEST(HttpRequestHead, ARequestLineOutOfShapeIsMalformed) {
  for (const char* bad :
       {"GET  / HTTP/1.1", "GET / HTTP/1.1 ", "GET /\tx HTTP/1.1", "GET /", "G(T / HTTP/1.1",
        " GET / HTTP/1.1", "GET / HTTP/2.0", "GET / http/1.1", "GET / HTTP/1.10",
        "GET /caf\xc3\xa9 HTTP/1.1", "GET pypi.org/ HTTP/1.1", "GET https://pypi.org/ HTTP/1.1",
        "GET http://user@pypi.org/ HTTP/1.1", ""})
    EXPECT_EQ(parse(std::string(bad) + "\r\nHost: a\r\n\r\n").verdict, HttpVerdict::malformed)
        << bad;
  EXPECT_EQ(complete("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").target, "*");
  EXPECT_EQ(complete("M-SEARCH /x?y=%20#f HTTP/1.1\r\n\r\n").method, "M-SEARCH");
}

TEST(HttpRequestHead, AnAbsoluteFormTargetNamesItsHost) {
  const HttpRequestHead head = complete(
      "GET HTTP://Deb.Debian.org:80/debian/dists HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n");
  EXPECT_TRUE(head.absolute_form);
  EXPECT_EQ(head.absolute_host, "deb.debian.org");
  EXPECT_EQ(head.target, "HTTP://Deb.Debian.org:80/debian/dists");
  EXPECT_EQ(complete("GET http://pypi.org HTTP/1.1\r\n\r\n").absolute_host, "pypi.org");
  EXPECT_EQ(complete("GET http://[::1]:8080?q HTTP/1.1\r\n\r\n").absolute_host, "::1");
}

TEST(HttpRequestHead, ConnectKeepsItsMethodForTheCallerToRefuse) {
  const HttpRequestHead head =
      complete("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n");
  EXPECT_EQ(head.method, "CONNECT");
  EXPECT_EQ(head.target, "pypi.org:443");
  EXPECT_FALSE(head.absolute_form);
  EXPECT_EQ(complete("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n").method, "CONNECT");
  EXPECT_EQ(malformed("CONNECT pypi.org HTTP/1.1\r\n\r\n"),
            "a CONNECT target that is not name:port");
  EXPECT_EQ(malformed("CONNECT / HTTP/1.1\r\n\r\n"), "a CONNECT target that is not name:port");
}

TEST(HttpRequestHead, UpgradeAndConnectionOptionsAreSeen) {
  HttpRequestHead head = complete(
      "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
      "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n");
  EXPECT_TRUE(head.upgrade);
  EXPECT_FALSE(head.connection_close);
  EXPECT_TRUE(complete("GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").upgrade);
  EXPECT_TRUE(complete("GET / HTTP/1.1\r\nConnection: ,upgrade\r\n\r\n").upgrade);
  head = complete("GET / HTTP/1.1\r\nConnection: keep-alive\r\nconnection: TE , Close\r\n\r\n");
  EXPECT_TRUE(head.connection_close);
  EXPECT_FALSE(head.upgrade);
  EXPECT_FALSE(complete("GET / HTTP/1.1\r\nConnection: closed\r\n\r\n").connection_close);
}

TEST(HttpRequestHead, AHeadPastTheLimitsIsTooLarge) {
  EXPECT_EQ(parse(kPipGet, kPipGet.size()).verdict, HttpVerdict::complete);
  EXPECT_EQ(parse(kPipGet, kPipGet.size() - 1).verdict, HttpVerdict::too_large);
  // Known before the rest arrives: the limit's worth and no end in it.
  EXPECT_EQ(parse(kPipGet.substr(0, 40), 40).verdict, HttpVerdict::too_large);
  EXPECT_EQ(parse(kPipGet.substr(0, 40), 41).verdict, HttpVerdict::need_more);
  EXPECT_EQ(parse(kPipGet, kMaxHead, 5).verdict, HttpVerdict::complete);
  EXPECT_EQ(parse(kPipGet, kMaxHead, 4).verdict, HttpVerdict::too_large);
}

TEST(HttpRequestHead, TheHeadSentUpstreamDropsHopByHopHeadersAndClosesTheConnection) {
  const Bytes head = bytes_of(
      "POST /upload HTTP/1.1\n"
      "Host: pypi.org\r\n"
      "Connection: keep-alive, Upgrade\r\n"
      "keep-alive: timeout=5\r\n"
      "Proxy-Connection: keep-alive\n"
      "UPGRADE: h2c\r\n"
      "Connection-Extra: kept\r\n"
      "Content-Length: 3\r\n"
      "\r\n"
      "abc");
  const Bytes with_extra =
      rewrite_http_request_head(head, {"X-Forwarded-For: 10.0.0.2", "Authorization: Bearer t"});
  EXPECT_EQ(std::string(with_extra.begin(), with_extra.end()),
            "POST /upload HTTP/1.1\r\n"
            "Host: pypi.org\r\n"
            "Connection-Extra: kept\r\n"
            "Content-Length: 3\r\n"
            "Connection: close\r\n"
            "X-Forwarded-For: 10.0.0.2\r\n"
            "Authorization: Bearer t\r\n"
            "\r\n");
  const Bytes rewritten = rewrite_http_request_head(head, {});
  EXPECT_EQ(std::string(rewritten.begin(), rewritten.end()),
            "POST /upload HTTP/1.1\r\nHost: pypi.org\r\nConnection-Extra: kept\r\n"
            "Content-Length: 3\r\nConnection: close\r\n\r\n");
}

// An injected credential replaces every header the request had under its name, in any case.
TEST(HttpRequestHead, AnInjectedHeaderReplacesTheRequestsOwnInAnyCase) {
  const Bytes head = bytes_of(
      "GET /v1 HTTP/1.1\r\n"
      "Host: api.example.com\r\n"
      "authorization: Bearer the-sandboxs\r\n"
      "X-Authorization: kept\r\n"
      "AUTHORIZATION: Basic again\r\n"
      "\r\n");
  const Bytes rewritten =
      rewrite_http_request_head(head, {"Authorization: Bearer real"}, {"Authorization"});
  EXPECT_EQ(std::string(rewritten.begin(), rewritten.end()),
            "GET /v1 HTTP/1.1\r\n"
            "Host: api.example.com\r\n"
            "X-Authorization: kept\r\n"
            "Connection: close\r\n"
            "Authorization: Bearer real\r\n"
            "\r\n");
}

// Feeds `body` to a framer one byte at a time; how many it took when it said done.
std::size_t frame_byte_by_byte(const HttpRequestHead& head, std::string_view body,
                               std::string& why) {
  HttpBodyFramer framer(head);
  std::size_t taken = 0;
  for (char c : body) {
    if (framer.done()) break;
    const auto byte = static_cast<std::uint8_t>(c);
    const auto used = framer.feed(std::span(&byte, 1), why);
    if (!used) return SIZE_MAX;
    taken += *used;
  }
  return framer.done() ? taken : 0;
}

HttpRequestHead chunked_head() {
  HttpRequestHead head;
  head.chunked = true;
  return head;
}

constexpr std::string_view kChunkedBody =
    "4;name=value\r\nWiki\r\n"
    "5 ; quoted=\"a;b\"\r\npedia\r\n"
    "E\r\n in\r\n\r\nchunks.\r\n"
    "0000;last\r\n"
    "X-Checksum: abc\r\n"
    "X-More: 1\r\n"
    "\r\n";
constexpr std::string_view kNextRequest = "GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n";

TEST(HttpBodyFramer, AChunkedBodyWithExtensionsAndTrailersEndsExactlyFedByteByByte) {
  std::string why;
  const std::string stream = std::string(kChunkedBody) + std::string(kNextRequest);
  EXPECT_EQ(frame_byte_by_byte(chunked_head(), stream, why), kChunkedBody.size()) << why;
}

TEST(HttpBodyFramer, APipelinedRequestAfterTheBodyIsNotTaken) {
  std::string why;
  const std::string chunked = std::string(kChunkedBody) + std::string(kNextRequest);
  HttpBodyFramer framer(chunked_head());
  EXPECT_EQ(framer.feed(bytes_of(chunked), why), kChunkedBody.size()) << why;
  EXPECT_TRUE(framer.done());
  EXPECT_EQ(framer.feed(bytes_of(kNextRequest), why), 0u);

  // A Content-Length body: the whole connection's bytes at once, then the next head from where
  // the body ended.
  const std::string connection =
      "POST /a HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 11\r\n\r\nhello world" +
      std::string(kNextRequest);
  const Bytes bytes = bytes_of(connection);
  HttpRequestHead head;
  ASSERT_EQ(parse_http_request_head(bytes, kMaxHead, kMaxHeaders, head, why),
            HttpVerdict::complete);
  HttpBodyFramer length_framer(head);
  const auto body = length_framer.feed(std::span(bytes).subspan(head.head_bytes), why);
  ASSERT_EQ(body, 11u);
  EXPECT_TRUE(length_framer.done());
  HttpRequestHead next;
  ASSERT_EQ(parse_http_request_head(std::span(bytes).subspan(head.head_bytes + *body), kMaxHead,
                                    kMaxHeaders, next, why),
            HttpVerdict::complete);
  EXPECT_EQ(next.target, "/second");
  EXPECT_EQ(next.host, "evil.test");
}

TEST(HttpBodyFramer, ABodyOfNoLengthIsDoneAtOnce) {
  HttpBodyFramer framer(HttpRequestHead{});
  EXPECT_TRUE(framer.done());
  std::string why;
  EXPECT_EQ(framer.feed(bytes_of(kNextRequest), why), 0u);
}

TEST(HttpBodyFramer, AContentLengthBodyIsCountedAcrossFeeds) {
  HttpRequestHead head;
  head.content_length = 5;
  HttpBodyFramer framer(head);
  std::string why;
  EXPECT_EQ(framer.feed(bytes_of("abc"), why), 3u);
  EXPECT_FALSE(framer.done());
  EXPECT_EQ(framer.feed(bytes_of("defgh"), why), 2u);
  EXPECT_TRUE(framer.done());
}

std::string framing_error(std::string_view body) {
  std::string why;
  EXPECT_EQ(frame_byte_by_byte(chunked_head(), body, why), SIZE_MAX) << body;
  // Fed whole, the verdict is the same.
  HttpBodyFramer framer(chunked_head());
  std::string whole_why;
  EXPECT_FALSE(framer.feed(bytes_of(body), whole_why));
  EXPECT_EQ(whole_why, why);
  EXPECT_FALSE(framer.feed(bytes_of("0\r\n\r\n"), whole_why)) << "broken for good";
  return why;
}

TEST(HttpBodyFramer, BrokenChunkFramingIsMalformed) {
  EXPECT_EQ(framing_error("x\r\n"), "a chunk without a hex size");
  EXPECT_EQ(framing_error(";a\r\n"), "a chunk without a hex size");
  EXPECT_EQ(framing_error(" 5\r\n"), "a chunk without a hex size");
  EXPECT_EQ(framing_error("5x\r\n"), "a chunk size that is not hex");
  EXPECT_EQ(framing_error("00000000000000005\r\n"), "a chunk size of more than 16 hex digits");
  EXPECT_EQ(framing_error("3\r\nabcd\r\n"), "chunk data longer than its size");
  EXPECT_EQ(framing_error("3\r\nabc\rd"), "chunk data longer than its size");
  EXPECT_EQ(framing_error("3\rabc"), "a CR not followed by LF after a chunk size");
  EXPECT_EQ(framing_error("3;a\x01\r\n"), "a control character in a chunk extension");
  EXPECT_EQ(framing_error("3;" + std::string(4097, 'e') + "\r\n"),
            "a chunk extension longer than 4096 bytes");
  EXPECT_EQ(framing_error("0\r\nX-A: 1\r\n b\r\n\r\n"), "a folded trailer line (obs-fold)");
  EXPECT_EQ(framing_error("0\r\nX-A: \x01\r\n\r\n"), "a control character in the trailers");
  EXPECT_EQ(framing_error("0\r\nX-A: 1\rb"), "a CR not followed by LF in the trailers");
  EXPECT_EQ(framing_error("0\r\n\rX"), "a CR not followed by LF in the trailers");
  EXPECT_EQ(framing_error("0\r\nX-A: " + std::string(8200, 'v') + "\r\n\r\n"),
            "trailers longer than 8192 bytes");
  // The body goes upstream as it came: a bare LF in its framing is refused, not guessed at.
  EXPECT_EQ(framing_error("3\nabc\r\n0\r\n\r\n"), "a line of the chunked body ended by LF alone");
  EXPECT_EQ(framing_error("3;x\nabc\r\n0\r\n\r\n"), "a line of the chunked body ended by LF alone");
  EXPECT_EQ(framing_error("3\r\nabc\n0\r\n\r\n"), "a line of the chunked body ended by LF alone");
  EXPECT_EQ(framing_error("0\r\nX-A: 1\n\r\n"), "a line of the chunked body ended by LF alone");
  EXPECT_EQ(framing_error("0\r\n\n"), "a line of the chunked body ended by LF alone");
}

TEST(HttpBodyFramer, TheLargestChunkSizeIsTakenAndCounted) {
  HttpBodyFramer framer(chunked_head());
  std::string why;
  EXPECT_EQ(framer.feed(bytes_of("FFFFFFFFFFFFFFFF\r\nabc"), why), 21u) << why;
  EXPECT_FALSE(framer.done());
  std::string stream = "0000000000000001\r\nZ\r\n0\r\n\r\n";
  EXPECT_EQ(frame_byte_by_byte(chunked_head(), stream, why), stream.size()) << why;
}

}  // namespace
}  // namespace rlm::protocols
