// One sandbox's own certificate authority, for the hosts whose credentials the host side injects
// (docs/network.md, "Credentials"): a fresh P-256 key and a self-signed CA certificate whose name
// constraints permit those names alone, and for each name a leaf signed by it. The sandbox's trust
// store is given the CA's certificate; the keys never leave this process and die with the
// sandbox's host side, so the CA vouches for nothing once the sandbox is gone, and never for a
// name outside its list even while it lives.
#pragma once

#include <openssl/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rlm::egress {

struct SslContextFree {
  void operator()(SSL_CTX* context) const;
};
using SslContext = std::unique_ptr<SSL_CTX, SslContextFree>;

class TlsAuthority {
 public:
  // `names`: the hosts (lowercase DNS names) it may vouch for, at least one. Throws Error when
  // OpenSSL cannot make a key or certificate.
  explicit TlsAuthority(const std::vector<std::string>& names);
  ~TlsAuthority();
  TlsAuthority(const TlsAuthority&) = delete;
  TlsAuthority& operator=(const TlsAuthority&) = delete;

  // The CA's certificate, PEM.
  const std::string& certificate_pem() const { return ca_pem_; }
  // A server context presenting `name`'s leaf (TLS 1.2 and up, ALPN http/1.1 only); nullptr for
  // a name it was not made for.
  SSL_CTX* server_context(const std::string& name) const;

 private:
  std::string ca_pem_;
  std::map<std::string, SslContext> servers_;
};

}  // namespace rlm::egress
