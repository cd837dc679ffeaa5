#include "egress/client_gate.hpp"

#include <algorithm>

#include "protocols/client_hello.hpp"

namespace rlm::egress {
namespace {

constexpr std::uint8_t kChangeCipherSpec = 20, kAlert = 21, kHandshake = 22, kApplicationData = 23;
constexpr std::uint8_t kClientHello = 1, kClientKeyExchange = 16;
constexpr std::size_t kRecordHeader = 5, kHandshakeHeader = 4, kMaxRecord = 16384 + 2048;
constexpr std::size_t kMaxHttpHead = 16384, kMaxHttpHeaders = 100;

}  // namespace

void deny_extra_request(const GateScope& scope, std::span<const std::uint8_t> bytes) {
  protocols::HttpRequestHead head;
  std::string why;
  if (protocols::parse_http_request_head(bytes, kMaxHttpHead, kMaxHttpHeaders, head, why) ==
          protocols::HttpVerdict::complete &&
      head.host != scope.name) {
    scope.account.deny(Denial::host_mismatch, head.host, scope.destination, scope.port);
    return;
  }
  scope.account.deny(Denial::protocol, scope.name, scope.destination, scope.port);
}

std::optional<std::size_t> HttpGate::admit(std::span<const std::uint8_t> peeked) {
  if (body_.done()) {  // a second request, pipelined or kept alive: never relayed
    deny_extra_request(scope_, peeked);
    return std::nullopt;
  }
  std::string why;
  const auto taken = body_.feed(peeked, why);
  if (!taken) {
    scope_.account.deny(Denial::protocol, scope_.name, scope_.destination, scope_.port);
    return std::nullopt;
  }
  if (*taken == 0 && body_.done()) {
    deny_extra_request(scope_, peeked);
    return std::nullopt;
  }
  return taken;
}

std::size_t TlsGate::window() const {
  return std::max(max_hello_, kRecordHeader + kMaxRecord);
}

std::optional<std::size_t> TlsGate::refuse(Denial kind, std::string name) {
  scope_.account.deny(kind, std::move(name), scope_.destination, scope_.port);
  return std::nullopt;
}

std::optional<std::size_t> TlsGate::admit(std::span<const std::uint8_t> peeked) {
  if (encrypted_) return peeked.size();
  std::size_t at = 0;
  while (at + kRecordHeader <= peeked.size()) {
    const auto record = peeked.subspan(at);
    const std::uint8_t type = record[0];
    const std::size_t length = std::size_t{record[3]} << 8 | record[4];
    if (type == kApplicationData) {
      encrypted_ = true;  // the client's handshake is encrypted from here: no more hellos to see
      return peeked.size();
    }
    if (type != kHandshake && type != kChangeCipherSpec && type != kAlert)
      return refuse(Denial::not_tls, scope_.name);
    if (length == 0 || length > kMaxRecord) return refuse(Denial::not_tls, scope_.name);
    if (type == kHandshake && handshake_left_ == 0 && record.size() > kRecordHeader &&
        record[kRecordHeader] == kClientHello) {
      // Another ClientHello (after a HelloRetryRequest): whole, and for the same name.
      protocols::ClientHello hello;
      switch (protocols::parse_client_hello(record, max_hello_, hello)) {
        case protocols::HelloVerdict::need_more:
          return at;
        case protocols::HelloVerdict::too_large:
          return refuse(Denial::limit, scope_.name);
        case protocols::HelloVerdict::not_tls:
        case protocols::HelloVerdict::malformed:
          return refuse(Denial::not_tls, scope_.name);
        case protocols::HelloVerdict::complete:
          break;
      }
      if (hello.encrypted_client_hello) return refuse(Denial::ech, scope_.name);
      if (!hello.server_name || hello.server_name_invalid || *hello.server_name != scope_.name)
        return refuse(Denial::sni_mismatch, hello.server_name.value_or(""));
      at += hello.bytes;
      continue;
    }
    if (record.size() < kRecordHeader + length) return at;  // whole records only
    if (type == kChangeCipherSpec && key_exchanged_) {
      // TLS 1.2: everything after the client's ChangeCipherSpec is encrypted (its Finished too,
      // though that record says handshake). In TLS 1.3 the client sends no ClientKeyExchange,
      // its ChangeCipherSpec is a dummy -- a second ClientHello may follow it -- and its
      // encrypted records are application_data.
      encrypted_ = true;
      return peeked.size();
    }
    if (type == kHandshake) {
      // Walk the messages this record holds, so the next record is known to start one or not.
      const auto fragment = record.subspan(kRecordHeader, length);
      std::size_t position = 0;
      while (position < fragment.size()) {
        if (handshake_left_ > 0) {
          const std::size_t take = std::min(handshake_left_, fragment.size() - position);
          handshake_left_ -= take;
          position += take;
          continue;
        }
        // A message header split across records, or a hello behind another message: a client
        // does neither, and neither is let by unread.
        if (fragment.size() - position < kHandshakeHeader || fragment[position] == kClientHello)
          return refuse(Denial::not_tls, scope_.name);
        if (fragment[position] == kClientKeyExchange) key_exchanged_ = true;
        handshake_left_ = std::size_t{fragment[position + 1]} << 16 |
                          std::size_t{fragment[position + 2]} << 8 | fragment[position + 3];
        position += kHandshakeHeader;
      }
    }
    at += kRecordHeader + length;
  }
  return at;
}

}  // namespace rlm::egress
