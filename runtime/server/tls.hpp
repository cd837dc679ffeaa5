// TLS for the server's TCP listener and its clients (docs/fleet.md, "Remote access"), on
// OpenSSL: TLS 1.3 only, a client certificate required on the server's side and the server's
// certificate checked against the client's CA and the host it dialled on the client's. A
// connection is a non-blocking socket under one SSL object; reads never wait, writes wait until a
// deadline. Errors are WireError (the connection is over) or TlsRefused (a handshake that failed,
// saying why in words a user can act on).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/unique_fd.hpp"
#include "server/wire.hpp"

struct ssl_ctx_st;
struct ssl_st;
struct ssl_session_st;

namespace rlm::server {

// A handshake that did not complete: no certificate, one from another CA, a name mismatch, plain
// TCP, a deadline passed.
class TlsRefused : public WireError {
 public:
  using WireError::WireError;
};

// One side's configuration: its certificate and key, and the CA its peers' certificates must
// chain to. Shared by every connection of a server or client (SSL_CTX is thread-safe once made).
class TlsContext {
 public:
  // The server's: requires and verifies a client certificate chained to `client_ca`, and not
  // revoked by the lists in `client_crl` (PEM; "": none checked). Throws Error naming the file
  // that cannot be used and OpenSSL's reason.
  static std::shared_ptr<TlsContext> for_server(const std::string& cert, const std::string& key,
                                                const std::string& client_ca,
                                                const std::string& client_crl = "");
  // A client's: presents `cert`/`key`, verifies the server against `ca`.
  static std::shared_ptr<TlsContext> for_client(const std::string& cert, const std::string& key,
                                                const std::string& ca);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  ssl_ctx_st* get() const { return context_; }

  // A client's last session with `endpoint`, for resumption (a reconnect skips the certificate
  // exchange); remembered per endpoint, one each.
  ssl_session_st* session_for(const std::string& endpoint) const;
  void remember_session(const std::string& endpoint, ssl_session_st* session);

 private:
  explicit TlsContext(ssl_ctx_st* context);
  ssl_ctx_st* context_;
  struct Sessions;
  std::unique_ptr<Sessions> sessions_;
};

// One TLS connection over a connected TCP socket (made non-blocking here).
class TlsStream {
 public:
  // The server's side of a handshake: done by `deadline` or TlsRefused.
  static TlsStream accept(std::shared_ptr<TlsContext> context, host::UniqueFd socket,
                          Clock::time_point deadline);
  // A client's: the server's certificate must name `host` (a DNS name or an IP address SAN).
  // `endpoint` keys session resumption.
  static TlsStream connect(std::shared_ptr<TlsContext> context, host::UniqueFd socket,
                           const std::string& host, const std::string& endpoint,
                           Clock::time_point deadline);
  TlsStream(TlsStream&& other) noexcept;
  TlsStream& operator=(TlsStream&&) = delete;
  ~TlsStream();

  int fd() const { return socket_.get(); }
  // The context the handshake was made with.
  const std::shared_ptr<TlsContext>& context() const { return context_; }
  // Bytes decrypted and waiting: poll() on fd() does not see them.
  bool buffered() const;
  // Whether the handshake resumed an earlier session (no certificate was checked in it).
  bool resumed() const;

  // Reads what is there without waiting: the count (0: nothing now), or nullopt at the peer's
  // end of stream. Throws WireError for a broken connection.
  std::optional<std::size_t> read_some(char* buffer, std::size_t size);
  // Writes all of `data` by `deadline`, or throws WireError.
  void write_all(std::string_view data, Clock::time_point deadline);
  // Sends close_notify, not waiting for the peer's.
  void close_now();

  // The peer certificate's identities: its subject's common name, then its subject alternative
  // names (DNS, URI, email; IP addresses as text). Empty without a certificate.
  std::vector<std::string> peer_identities() const;
  // Checks the peer's certificate again, now, against `context`'s CA and revocation lists (a
  // server's context made anew from a changed list): "" when it still verifies, else why not.
  std::string peer_verification_failure(const TlsContext& context) const;

 private:
  TlsStream(std::shared_ptr<TlsContext> context, host::UniqueFd socket);
  // Waits for what OpenSSL asked for (`error` is SSL_get_error's) until `deadline`.
  bool wait_for(int error, Clock::time_point deadline) const;
  std::shared_ptr<TlsContext> context_;
  host::UniqueFd socket_;
  ssl_st* ssl_ = nullptr;
};

// "HOST:PORT" or "[V6]:PORT" split; nullopt when it is not one.
struct HostPort {
  std::string host;
  std::string port;
};
std::optional<HostPort> split_host_port(std::string_view text);

// A TCP socket connected to `host`:`port` by `deadline` (each resolved address tried in turn);
// throws ServerRefused ("unavailable") saying why not.
host::UniqueFd connect_tcp(const HostPort& where, Clock::time_point deadline);

}  // namespace rlm::server
