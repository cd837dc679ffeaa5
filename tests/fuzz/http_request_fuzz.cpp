// libFuzzer harness for HTTP/1.x requests through the egress proxy
// (runtime/protocols/http_request.hpp): a connection's bytes from a sandbox. The head is parsed,
// rewritten for the upstream, and the rest fed to the body framer in reads of sizes taken from
// the data. Beyond the sanitizers, it checks what the proxy relies on: the rewritten head parses
// as the same request with Connection: close and no upgrade, and an injected header is the only
// one of its name; the framer stops exactly where the body ends and finds the same end (or the
// same fault) however the bytes are split.
// Seed corpus: tests/fuzz/corpus/http_request/.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "protocols/http_request.hpp"

namespace {

using namespace rlm::protocols;

constexpr std::size_t kMaxHead = 4096, kMaxHeaders = 32;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

struct Framed {
  bool failed = false;
  bool done = false;
  std::size_t taken = 0;
};

// Feeds `body` in reads whose sizes come from the bytes themselves (1..61), or whole.
Framed frame(const HttpRequestHead& head, std::span<const std::uint8_t> body, bool whole) {
  HttpBodyFramer framer(head);
  Framed framed;
  std::string why;
  for (std::size_t at = 0; at < body.size() && !framer.done();) {
    const std::size_t read =
        whole ? body.size() : std::min<std::size_t>(1 + body[at] % 61, body.size() - at);
    const auto used = framer.feed(body.subspan(at, read), why);
    if (!used) {
      check(!why.empty());
      framed.failed = true;
      return framed;
    }
    check(*used <= read);
    if (*used < read) check(framer.done());  // it stops short only at the body's end
    at += *used;
    framed.taken = at;
  }
  framed.done = framer.done();
  if (framed.done) check(framer.feed(body.subspan(framed.taken), why) == 0u);
  return framed;
}

// How many header lines of `head` (a rewritten one: CRLF line ends) have the field name `name`,
// compared without case after trimming the spaces and tabs around it.
std::size_t headers_named(std::span<const std::uint8_t> head, std::string_view name) {
  const std::string_view text(reinterpret_cast<const char*>(head.data()), head.size());
  std::size_t count = 0;
  std::size_t at = text.find("\r\n");  // past the request line
  while (at != std::string_view::npos && at + 2 < text.size()) {
    const std::size_t end = text.find("\r\n", at + 2);
    std::string_view line = text.substr(at + 2, end == std::string_view::npos ? end : end - at - 2);
    std::string_view field = line.substr(0, line.find(':'));
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t'))
      field.remove_prefix(1);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\t')) field.remove_suffix(1);
    if (line.find(':') != std::string_view::npos && field.size() == name.size() &&
        std::equal(field.begin(), field.end(), name.begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; }))
      ++count;
    at = end;
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  HttpRequestHead head;
  std::string why;
  const HttpVerdict verdict = parse_http_request_head(bytes, kMaxHead, kMaxHeaders, head, why);
  if (verdict == HttpVerdict::malformed) check(!why.empty());
  if (verdict != HttpVerdict::complete) {
    (void)rewrite_http_request_head(bytes, {"X-Proxy: 1"});  // whatever it is given
    return 0;
  }
  check(head.head_bytes > 0 && head.head_bytes <= size && head.head_bytes <= kMaxHead);
  check(!(head.chunked && head.content_length != 0));

  // The head sent upstream is the same request, closing, with nothing to upgrade.
  const auto rewritten = rewrite_http_request_head(bytes.first(head.head_bytes), {"X-Proxy: 1"});
  HttpRequestHead upstream;
  check(parse_http_request_head(rewritten, kMaxHead * 2, kMaxHeaders + 2, upstream, why) ==
        HttpVerdict::complete);
  check(upstream.head_bytes == rewritten.size());
  check(upstream.method == head.method && upstream.target == head.target &&
        upstream.host == head.host && upstream.host_port == head.host_port &&
        upstream.chunked == head.chunked && upstream.content_length == head.content_length);
  check(upstream.connection_close && !upstream.upgrade);

  // An injected header is the only one of its name that goes upstream.
  const auto injected = rewrite_http_request_head(bytes.first(head.head_bytes),
                                                  {"Authorization: real"}, {"authorization"});
  check(headers_named(injected, "authorization") == 1);

  // The body's end does not depend on how its bytes arrive.
  const auto rest = bytes.subspan(head.head_bytes);
  const Framed in_reads = frame(head, rest, false);
  const Framed at_once = frame(head, rest, true);
  check(in_reads.failed == at_once.failed);
  if (!in_reads.failed) check(in_reads.done == at_once.done && in_reads.taken == at_once.taken);
  return 0;
}
