// libFuzzer harness for the TLS ClientHello peek (runtime/protocols/client_hello.hpp): the first
// bytes a sandbox sends on a TLS connection. Beyond the sanitizers, it checks what the proxy
// relies on: a complete hello took no more bytes than it was given, its server name is one the
// allowlist can compare (lowercase LDH, '.', '_') or flagged, and every prefix of a complete
// hello asks for more rather than deciding early. Seed corpus: tests/fuzz/corpus/client_hello/.
#include <cstddef>
#include <cstdint>
#include <span>

#include "protocols/client_hello.hpp"

namespace {

using namespace rlm::protocols;

constexpr std::size_t kMaxHello = 16384;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

bool comparable_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name.front() == '.' || name.back() == '.') return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_'))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> stream(data, size);
  ClientHello hello;
  const HelloVerdict verdict = parse_client_hello(stream, kMaxHello, hello);
  if (size > 0 && data[0] != 22) check(verdict == HelloVerdict::not_tls);
  if (verdict != HelloVerdict::complete) return 0;

  check(hello.bytes > 0 && hello.bytes <= size && hello.bytes <= kMaxHello);
  if (hello.server_name) {
    if (hello.server_name_invalid)
      check(hello.server_name->empty());
    else
      check(comparable_name(*hello.server_name));
  } else {
    check(!hello.server_name_invalid);
  }
  // A prefix of a complete hello is need_more; the same hello under a smaller limit too_large.
  ClientHello prefix_hello;
  for (std::size_t cut : {hello.bytes / 2, hello.bytes - 1})
    check(parse_client_hello(stream.first(cut), kMaxHello, prefix_hello) ==
          HelloVerdict::need_more);
  check(parse_client_hello(stream, hello.bytes - 1, prefix_hello) == HelloVerdict::too_large);
  // What follows the hello does not change it.
  check(parse_client_hello(stream.first(hello.bytes), kMaxHello, prefix_hello) ==
            HelloVerdict::complete &&
        prefix_hello.server_name == hello.server_name && prefix_hello.bytes == hello.bytes);
  return 0;
}
