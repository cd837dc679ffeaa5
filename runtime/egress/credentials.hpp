// An allowlist's injected credentials (docs/network.md, "Credentials"): for each `inject` entry,
// the value read in the parent before the sandbox is built -- from the runtime's environment or
// a host file -- and the TLS the host side speaks on both sides of such a connection: this
// sandbox's own CA (tls_authority.hpp) towards the sandbox, the host's CA store (or
// RLM_SANDBOX_UPSTREAM_CA) towards the upstream. Values are wiped from memory when it goes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "egress/tls_authority.hpp"
#include "egress/upstream.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

struct Injection {
  std::string name;  // the host, lowercase
  std::uint16_t port = 443;
  std::string header;  // its name, as the policy spells it
  std::string value;   // the secret
};

class Credentials {
 public:
  // Throws Error naming network.inject[i] when a value cannot be read (a variable not set, a file
  // missing or unreadable, over 64 KiB) or would break the request's head (CR, LF or NUL), or when
  // OpenSSL cannot make the CA or the upstream context.
  Credentials(const Egress& egress, const UpstreamSettings& upstream);
  ~Credentials();
  Credentials(const Credentials&) = delete;
  Credentials& operator=(const Credentials&) = delete;

  // The injections for (name, port), none when it has none.
  std::vector<const Injection*> for_host(const std::string& name, std::uint16_t port) const;
  // The sandbox's trust store, PEM: the host's CA bundle where it has one, then this sandbox's CA.
  std::string trust_bundle() const;

  SSL_CTX* sandbox_side(const std::string& name) const { return authority_.server_context(name); }
  SSL_CTX* upstream_side() const { return upstream_.get(); }

 private:
  std::vector<Injection> injections_;
  TlsAuthority authority_;
  SslContext upstream_;
};

// The injections' hosts, for the authority's names.
std::vector<std::string> injected_names(const Egress& egress);

}  // namespace rlm::egress
