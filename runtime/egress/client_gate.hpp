// What of the sandbox's bytes may go upstream after a connection's first check, judged as they
// stream by (connection.hpp): on http:// entries the first request's body and nothing after it;
// on TLS entries every further plaintext ClientHello -- the one a client sends after a
// HelloRetryRequest -- must name the same host as the first, until the handshake is encrypted.
// A gate that refuses records why in the account; the connection then ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "egress/account.hpp"
#include "protocols/http_request.hpp"

namespace rlm::egress {

class ClientGate {
 public:
  virtual ~ClientGate() = default;
  // How many bytes at the start of `peeked` (the sandbox's bytes not yet relayed) may go now;
  // 0: none until more arrive; nullopt: the connection ends (the denial is recorded).
  virtual std::optional<std::size_t> admit(std::span<const std::uint8_t> peeked) = 0;
  // The most admit() needs to see at once to decide.
  virtual std::size_t window() const = 0;
  // Whether every byte from now on passes unseen (the relay then reads without peeking).
  virtual bool passes_everything() const { return false; }
};

// Who a gate records a refusal against.
struct GateScope {
  Account& account;
  std::string name, destination;
  std::uint16_t port = 0;
};

// http://: the first request's body (its head was checked and sent already), then nothing.
class HttpGate final : public ClientGate {
 public:
  HttpGate(GateScope scope, const protocols::HttpBodyFramer& body)
      : scope_(std::move(scope)), body_(body) {}
  std::optional<std::size_t> admit(std::span<const std::uint8_t> peeked) override;
  std::size_t window() const override { return 16384; }

 private:
  GateScope scope_;
  protocols::HttpBodyFramer body_;
};

// TLS: whole records only while the handshake is in plaintext, a ClientHello among them checked
// like the first; everything once the client sends encrypted records (application_data).
class TlsGate final : public ClientGate {
 public:
  TlsGate(GateScope scope, std::size_t max_hello)
      : scope_(std::move(scope)), max_hello_(max_hello) {}
  std::optional<std::size_t> admit(std::span<const std::uint8_t> peeked) override;
  std::size_t window() const override;
  bool passes_everything() const override { return encrypted_; }

 private:
  std::optional<std::size_t> refuse(Denial kind, std::string name);
  GateScope scope_;
  std::size_t max_hello_;
  bool encrypted_ = false;          // past the plaintext handshake: every byte passes
  bool key_exchanged_ = false;      // a TLS 1.2 ClientKeyExchange went by
  std::size_t handshake_left_ = 0;  // bytes of a handshake message that continues in later records
};

// The Host a request at the start of `bytes` asks for, as a denial: host_mismatch for another
// host, else protocol (one request a connection).
void deny_extra_request(const GateScope& scope, std::span<const std::uint8_t> bytes);

}  // namespace rlm::egress
