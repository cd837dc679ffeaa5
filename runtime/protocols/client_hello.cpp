#include "protocols/client_hello.hpp"

#include <algorithm>
#include <bitset>
#include <string_view>
#include <vector>

#include "protocols/host_name.hpp"

namespace rlm::protocols {
namespace {

constexpr std::uint8_t kRecordHandshake = 22, kHandshakeClientHello = 1;
constexpr std::size_t kRecordHeaderBytes = 5, kHandshakeHeaderBytes = 4;
constexpr std::size_t kMaxRecordPayload = 16384;  // RFC 8446 5.1: 2^14 plaintext bytes
constexpr std::size_t kRandomBytes = 32, kMaxSessionId = 32;
constexpr std::uint8_t kServerNameHostName = 0;

// Reads a ClientHello's fields in order; every read checks what is left first.
class Cursor {
 public:
  explicit Cursor(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::size_t left() const { return bytes_.size(); }
  bool u8(std::size_t& value) { return number(1, value); }
  bool u16(std::size_t& value) { return number(2, value); }
  bool take(std::size_t count, std::span<const std::uint8_t>& out) {
    if (count > bytes_.size()) return false;
    out = bytes_.first(count);
    bytes_ = bytes_.subspan(count);
    return true;
  }
  bool skip(std::size_t count) {
    std::span<const std::uint8_t> ignored;
    return take(count, ignored);
  }

 private:
  bool number(std::size_t width, std::size_t& value) {
    std::span<const std::uint8_t> digits;
    if (!take(width, digits)) return false;
    value = 0;
    for (std::uint8_t byte : digits) value = value << 8 | byte;
    return true;
  }
  std::span<const std::uint8_t> bytes_;
};

// RFC 6066 3: a list of names, each a type byte and a 16-bit length; we take exactly one
// host_name. False when the list's lengths do not add up; a list that adds up but does not name
// one valid host is flagged instead, for the caller to refuse by name.
bool read_server_name(std::span<const std::uint8_t> data, ClientHello& hello) {
  Cursor cursor(data);
  std::size_t list_bytes = 0;
  if (!cursor.u16(list_bytes) || list_bytes != cursor.left()) return false;
  int host_names = 0;
  std::span<const std::uint8_t> host_name;
  while (cursor.left() > 0) {
    std::size_t name_type = 0, name_bytes = 0;
    std::span<const std::uint8_t> name;
    if (!cursor.u8(name_type) || !cursor.u16(name_bytes) || !cursor.take(name_bytes, name))
      return false;
    if (name_type == kServerNameHostName) {
      ++host_names;
      host_name = name;
    }
  }
  std::optional<std::string> normalized;
  if (host_names == 1)
    normalized = normalize_host_name(
        std::string_view(reinterpret_cast<const char*>(host_name.data()), host_name.size()));
  hello.server_name_invalid = !normalized;
  hello.server_name = normalized ? std::move(*normalized) : std::string();
  return true;
}

// The ClientHello body (after its handshake header), RFC 8446 4.1.2.
HelloVerdict read_client_hello(std::span<const std::uint8_t> body, ClientHello& hello) {
  Cursor cursor(body);
  std::size_t legacy_version = 0, session_id_bytes = 0, cipher_suite_bytes = 0,
              compression_bytes = 0;
  if (!cursor.u16(legacy_version) || legacy_version >> 8 != 3) return HelloVerdict::malformed;
  if (!cursor.skip(kRandomBytes)) return HelloVerdict::malformed;
  if (!cursor.u8(session_id_bytes) || session_id_bytes > kMaxSessionId ||
      !cursor.skip(session_id_bytes))
    return HelloVerdict::malformed;
  if (!cursor.u16(cipher_suite_bytes) || cipher_suite_bytes < 2 || cipher_suite_bytes % 2 != 0 ||
      !cursor.skip(cipher_suite_bytes))
    return HelloVerdict::malformed;
  if (!cursor.u8(compression_bytes) || compression_bytes < 1 || !cursor.skip(compression_bytes))
    return HelloVerdict::malformed;
  if (cursor.left() == 0) return HelloVerdict::complete;  // a hello with no extensions

  std::size_t extension_bytes = 0;
  if (!cursor.u16(extension_bytes) || extension_bytes != cursor.left())
    return HelloVerdict::malformed;
  // RFC 8446 4.2: one extension of each type at most. A bit per type: 8 KiB, no allocation.
  std::bitset<65536> seen;
  while (cursor.left() > 0) {
    std::size_t type = 0, data_bytes = 0;
    std::span<const std::uint8_t> data;
    if (!cursor.u16(type) || !cursor.u16(data_bytes) || !cursor.take(data_bytes, data))
      return HelloVerdict::malformed;
    if (seen.test(type)) return HelloVerdict::malformed;
    seen.set(type);
    if (type == kTlsExtensionServerName && !read_server_name(data, hello))
      return HelloVerdict::malformed;
    // The RFC's code point, the drafts' before it (0xfe08-0xfe0c) and ESNI's (0xffce): each hides
    // the name the connection is for.
    if ((type >= 0xfe08 && type <= kTlsExtensionEch) || type == kTlsExtensionEsni)
      hello.encrypted_client_hello = true;
  }
  return HelloVerdict::complete;
}

}  // namespace

HelloVerdict parse_client_hello(std::span<const std::uint8_t> stream, std::size_t max_bytes,
                                ClientHello& hello) {
  hello = ClientHello{};
  // The handshake message, gathered from the fragments the records carry.
  std::vector<std::uint8_t> handshake;
  std::optional<std::size_t> handshake_bytes;  // header included, once its header is in
  std::size_t at = 0, record_headers = 0, declared = 0;
  for (bool first = true;; first = false) {
    // The first record decides whether this is TLS at all; a later one that is not a handshake
    // record is a broken hello.
    const HelloVerdict not_a_record = first ? HelloVerdict::not_tls : HelloVerdict::malformed;
    const std::span<const std::uint8_t> record = stream.subspan(at);
    if (record.empty()) return at >= max_bytes ? HelloVerdict::too_large : HelloVerdict::need_more;
    if (record[0] != kRecordHandshake) return not_a_record;
    if (record.size() > 1 && record[1] != 3) return not_a_record;
    if (record.size() > 2 && (record[2] < 1 || record[2] > 3)) return not_a_record;
    if (record.size() < kRecordHeaderBytes)
      return at + kRecordHeaderBytes > max_bytes ? HelloVerdict::too_large
                                                 : HelloVerdict::need_more;
    const std::size_t length = std::size_t{record[3]} << 8 | record[4];
    if (length == 0 || length > kMaxRecordPayload) return HelloVerdict::malformed;
    record_headers += kRecordHeaderBytes;
    declared += length;

    const auto fragment =
        record.subspan(kRecordHeaderBytes, std::min(length, record.size() - kRecordHeaderBytes));
    handshake.insert(handshake.end(), fragment.begin(), fragment.end());
    if (!handshake.empty() && handshake[0] != kHandshakeClientHello) return HelloVerdict::not_tls;
    if (!handshake_bytes && handshake.size() >= kHandshakeHeaderBytes)
      handshake_bytes = kHandshakeHeaderBytes + (std::size_t{handshake[1]} << 16 |
                                                 std::size_t{handshake[2]} << 8 | handshake[3]);
    // The records carry more than the hello: nothing else may share them before the reply.
    if (handshake_bytes && declared > *handshake_bytes) return HelloVerdict::malformed;
    // At least the headers so far and the whole message: more than the caller will read.
    if (at + kRecordHeaderBytes + length > max_bytes ||
        (handshake_bytes && record_headers + *handshake_bytes > max_bytes))
      return HelloVerdict::too_large;
    if (fragment.size() < length) return HelloVerdict::need_more;
    at += kRecordHeaderBytes + length;
    if (handshake_bytes && handshake.size() == *handshake_bytes) {
      hello.bytes = at;
      const HelloVerdict verdict = read_client_hello(
          std::span<const std::uint8_t>(handshake).subspan(kHandshakeHeaderBytes), hello);
      if (verdict != HelloVerdict::complete) hello = ClientHello{};
      return verdict;
    }
  }
}

}  // namespace rlm::protocols
