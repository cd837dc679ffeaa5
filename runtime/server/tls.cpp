#include "server/tls.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <map>
#include <mutex>

#include "host/sigpipe_blocked.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::server {
namespace {

// OpenSSL's queued reasons, joined; the queue is left empty for the next call on this thread.
std::string openssl_reasons() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(code, line, sizeof line);
    const char* reason = ERR_reason_error_string(code);
    if (!text.empty()) text += "; ";
    text += reason ? reason : line;
  }
  return text.empty() ? "no reason given" : text;
}

// What a failed handshake or read means, for the person at the keyboard: the alerts a peer sends
// when it rejects our certificate, or when we presented none.
std::string explain(const std::string& reasons) {
  if (reasons.find("certificate required") != std::string::npos)
    return "the server requires a client certificate (--tls-cert and --tls-key, or "
           "RLM_SANDBOX_TLS_CERT and RLM_SANDBOX_TLS_KEY): " +
           reasons;
  if (reasons.find("certificate revoked") != std::string::npos)
    return "the server has revoked this client certificate (its --client-crl): " + reasons;
  if (reasons.find("unknown ca") != std::string::npos ||
      reasons.find("bad certificate") != std::string::npos ||
      reasons.find("decrypt error") != std::string::npos)
    return "the server does not accept this client certificate (not issued by its --client-ca, "
           "or its --client-crl has no current list for that CA): " +
           reasons;
  if (reasons.find("wrong version number") != std::string::npos ||
      reasons.find("http request") != std::string::npos ||
      reasons.find("packet length too long") != std::string::npos)
    return "the peer does not speak TLS: " + reasons;
  if (reasons.find("certificate verify failed") != std::string::npos)
    return "the peer's certificate does not verify against the CA given: " + reasons;
  if (reasons.find("unsupported protocol") != std::string::npos ||
      reasons.find("protocol version") != std::string::npos)
    return "the peer does not speak TLS 1.3: " + reasons;
  return reasons;
}

[[noreturn]] void fail_file(const std::string& what, const std::string& path) {
  throw Error("TLS " + what + " " + (path.empty() ? std::string("(none given)") : path) + ": " +
              openssl_reasons());
}

SSL_CTX* make_context(const SSL_METHOD* method, const std::string& cert, const std::string& key,
                      const std::string& ca) {
  // A file that cannot be read is said so plainly (OpenSSL's own words are "system lib").
  for (const auto& [what, path] : {std::pair{"certificate", &cert}, {"key", &key}, {"CA", &ca}})
    if (!path->empty() && access(path->c_str(), R_OK) != 0)
      throw Error(std::string("TLS ") + what + " " + *path + ": " + sys::errno_text(errno));
  SSL_CTX* context = SSL_CTX_new(method);
  if (!context) throw Error("TLS: " + openssl_reasons());
  SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(context, TLS1_3_VERSION);
  SSL_CTX_set_mode(context, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  try {
    if (!cert.empty() && SSL_CTX_use_certificate_chain_file(context, cert.c_str()) != 1)
      fail_file("certificate", cert);
    if (!key.empty() && SSL_CTX_use_PrivateKey_file(context, key.c_str(), SSL_FILETYPE_PEM) != 1)
      fail_file("key", key);
    if (!cert.empty() && !key.empty() && SSL_CTX_check_private_key(context) != 1)
      fail_file("key (it is not the certificate's)", key);
    if (ca.empty()) throw Error("TLS: a CA file is needed to check the peer's certificate");
    if (SSL_CTX_load_verify_locations(context, ca.c_str(), nullptr) != 1) fail_file("CA", ca);
  } catch (...) {
    SSL_CTX_free(context);
    throw;
  }
  return context;
}

bool would_block(int error) {
  return error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE;
}

}  // namespace

struct TlsContext::Sessions {
  std::mutex mutex;
  std::map<std::string, SSL_SESSION*> by_endpoint;
  ~Sessions() {
    for (auto& [endpoint, session] : by_endpoint) SSL_SESSION_free(session);
  }
};

std::shared_ptr<TlsContext> TlsContext::for_server(const std::string& cert, const std::string& key,
                                                   const std::string& client_ca,
                                                   const std::string& client_crl) {
  if (cert.empty() || key.empty() || client_ca.empty())
    throw Error("a TLS listener needs --tls-cert, --tls-key and --client-ca");
  std::shared_ptr<TlsContext> made(
      new TlsContext(make_context(TLS_server_method(), cert, key, client_ca)));
  SSL_CTX* context = made->context_;
  SSL_CTX_set_verify(context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  if (!client_crl.empty()) {
    // Every client certificate is looked up in its issuer's list: one revoked is refused, and so
    // is one whose issuer has no list here or whose list has expired (fail closed).
    if (access(client_crl.c_str(), R_OK) != 0)
      throw Error("TLS client CRL " + client_crl + ": " + sys::errno_text(errno));
    X509_STORE* store = SSL_CTX_get_cert_store(context);
    X509_LOOKUP* lookup = X509_STORE_add_lookup(store, X509_LOOKUP_file());
    if (!lookup || X509_load_crl_file(lookup, client_crl.c_str(), X509_FILETYPE_PEM) <= 0)
      fail_file("client CRL (expected PEM revocation lists)", client_crl);
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
    // A resumed session skips the check: resumption is kept to 5 minutes after the handshake that
    // checked it (a new list flushes the cache at once: ServerTlsContext).
    SSL_CTX_set_timeout(context, 300);
  }
  // Tell clients which CA we accept (what a browser-like client uses to choose a certificate).
  if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str()))
    SSL_CTX_set_client_CA_list(context, names);
  // Resumption from the server's own cache ("stateful tickets"): a stateless ticket carries the
  // client's certificate, and decoding it again on every connection (OpenSSL 3.0's decoders)
  // cost a resumed handshake about a millisecond of CPU; a cached session keeps it decoded.
  SSL_CTX_set_options(context, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_SERVER);
  SSL_CTX_sess_set_cache_size(context, 4096);
  SSL_CTX_set_num_tickets(context, 1);  // one resumption ticket per connection is enough
  static const unsigned char kContextId[] = "rlm-sandbox";
  SSL_CTX_set_session_id_context(context, kContextId, sizeof kContextId - 1);
  return made;
}

namespace {
// The endpoint a client connection is for (SSL app data), so a ticket is remembered under it.
struct ClientTag {
  TlsContext* context;
  std::string endpoint;
};
int remember_ticket(SSL* ssl, SSL_SESSION* session) {
  auto* tag = static_cast<ClientTag*>(SSL_get_app_data(ssl));
  if (!tag) return 0;
  tag->context->remember_session(tag->endpoint, session);
  return 1;  // we keep the reference
}
}  // namespace

std::shared_ptr<TlsContext> TlsContext::for_client(const std::string& cert, const std::string& key,
                                                   const std::string& ca) {
  if (cert.empty() != key.empty())
    throw Error("a TLS client certificate needs its key too (--tls-cert with --tls-key)");
  std::shared_ptr<TlsContext> made(
      new TlsContext(make_context(TLS_client_method(), cert, key, ca)));
  made->sessions_ = std::make_unique<Sessions>();
  SSL_CTX_set_verify(made->context_, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_session_cache_mode(made->context_,
                                 SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(made->context_, remember_ticket);
  return made;
}

TlsContext::TlsContext(SSL_CTX* context) : context_(context) {}

TlsContext::~TlsContext() {
  sessions_.reset();
  SSL_CTX_free(context_);
}

SSL_SESSION* TlsContext::session_for(const std::string& endpoint) const {
  if (!sessions_) return nullptr;
  std::lock_guard lock(sessions_->mutex);
  const auto found = sessions_->by_endpoint.find(endpoint);
  if (found == sessions_->by_endpoint.end()) return nullptr;
  SSL_SESSION_up_ref(found->second);
  return found->second;
}

void TlsContext::remember_session(const std::string& endpoint, SSL_SESSION* session) {
  if (!sessions_) {
    SSL_SESSION_free(session);
    return;
  }
  std::lock_guard lock(sessions_->mutex);
  constexpr std::size_t kMaxEndpoints = 4096;  // a fleet's nodes; beyond, no resumption
  auto [slot, added] = sessions_->by_endpoint.emplace(endpoint, session);
  if (!added) {
    SSL_SESSION_free(slot->second);
    slot->second = session;
  } else if (sessions_->by_endpoint.size() > kMaxEndpoints) {
    sessions_->by_endpoint.erase(slot);
    SSL_SESSION_free(session);
  }
}

TlsStream::TlsStream(std::shared_ptr<TlsContext> context, host::UniqueFd socket)
    : context_(std::move(context)), socket_(std::move(socket)) {
  const int flags = fcntl(socket_.get(), F_GETFL);
  fcntl(socket_.get(), F_SETFL, flags | O_NONBLOCK);
  const int on = 1;
  setsockopt(socket_.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  ssl_ = SSL_new(context_->get());
  if (!ssl_ || SSL_set_fd(ssl_, socket_.get()) != 1) {
    const std::string why = openssl_reasons();
    if (ssl_) SSL_free(ssl_);
    ssl_ = nullptr;
    throw WireError("TLS: " + why);
  }
}

TlsStream::TlsStream(TlsStream&& other) noexcept
    : context_(std::move(other.context_)),
      socket_(std::move(other.socket_)),
      ssl_(std::exchange(other.ssl_, nullptr)) {}

TlsStream::~TlsStream() {
  if (ssl_) {
    delete static_cast<ClientTag*>(SSL_get_app_data(ssl_));
    SSL_free(ssl_);
  }
}

bool TlsStream::wait_for(int error, Clock::time_point deadline) const {
  pollfd entry{socket_.get(), static_cast<short>(error == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN),
               0};
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return false;
    const int ready = poll(&entry, 1, static_cast<int>(left) + 1);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

TlsStream TlsStream::accept(std::shared_ptr<TlsContext> context, host::UniqueFd socket,
                            Clock::time_point deadline) {
  const host::SigpipeBlocked quiet_pipe;
  TlsStream stream(std::move(context), std::move(socket));
  ERR_clear_error();
  for (;;) {
    const int done = SSL_accept(stream.ssl_);
    if (done == 1) return stream;
    const int error = SSL_get_error(stream.ssl_, done);
    if (!would_block(error)) {
      if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
        throw TlsRefused("the client left during the TLS handshake");
      throw TlsRefused("TLS handshake: " + explain(openssl_reasons()));
    }
    if (!stream.wait_for(error, deadline))
      throw TlsRefused("TLS handshake: no handshake within the deadline");
  }
}

TlsStream TlsStream::connect(std::shared_ptr<TlsContext> context, host::UniqueFd socket,
                             const std::string& host, const std::string& endpoint,
                             Clock::time_point deadline) {
  const host::SigpipeBlocked quiet_pipe;
  TlsStream stream(std::move(context), std::move(socket));
  SSL* ssl = stream.ssl_;
  // The name the server's certificate must carry: an IP address SAN for an address, else DNS.
  in6_addr address6{};
  in_addr address4{};
  const bool is_address = inet_pton(AF_INET, host.c_str(), &address4) == 1 ||
                          inet_pton(AF_INET6, host.c_str(), &address6) == 1;
  X509_VERIFY_PARAM* check = SSL_get0_param(ssl);
  if (is_address ? X509_VERIFY_PARAM_set1_ip_asc(check, host.c_str()) != 1
                 : (SSL_set_tlsext_host_name(ssl, host.c_str()) != 1 ||
                    SSL_set1_host(ssl, host.c_str()) != 1))
    throw TlsRefused("TLS: cannot check the server's name '" + host + "': " + openssl_reasons());
  auto* tag = new ClientTag{stream.context_.get(), endpoint};
  SSL_set_app_data(ssl, tag);
  if (SSL_SESSION* earlier = stream.context_->session_for(endpoint)) {
    SSL_set_session(ssl, earlier);
    SSL_SESSION_free(earlier);
  }
  ERR_clear_error();
  for (;;) {
    const int done = SSL_connect(ssl);
    if (done == 1) return stream;
    const int error = SSL_get_error(ssl, done);
    if (!would_block(error)) {
      if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
        throw TlsRefused("TLS handshake with " + endpoint +
                         ": the server closed the connection (is it a TLS listener?)");
      const long verified = SSL_get_verify_result(ssl);
      std::string why = explain(openssl_reasons());
      if (verified != X509_V_OK)
        why += " (" + std::string(X509_verify_cert_error_string(verified)) + ")";
      throw TlsRefused("TLS handshake with " + endpoint + ": " + why);
    }
    if (!stream.wait_for(error, deadline))
      throw TlsRefused("TLS handshake with " + endpoint + ": no handshake within the deadline");
  }
}

bool TlsStream::buffered() const {
  return SSL_pending(ssl_) > 0;
}

bool TlsStream::resumed() const {
  return SSL_session_reused(ssl_) == 1;
}

std::optional<std::size_t> TlsStream::read_some(char* buffer, std::size_t size) {
  const host::SigpipeBlocked quiet_pipe;  // a read may answer a key update
  ERR_clear_error();
  std::size_t got = 0;
  if (SSL_read_ex(ssl_, buffer, size, &got) == 1) return got;
  const int error = SSL_get_error(ssl_, 0);
  if (would_block(error)) return std::size_t{0};
  if (error == SSL_ERROR_ZERO_RETURN) return std::nullopt;
  if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) return std::nullopt;  // plain EOF
  // A peer that died (kill -9) closes without close_notify: OpenSSL 3 says "unexpected eof".
  // That is the connection's end, as a unix socket's EOF (a run's node_lost), not a refusal.
  if (error == SSL_ERROR_SSL &&
      ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    return std::nullopt;
  }
  throw WireError("TLS: " + explain(openssl_reasons()));
}

void TlsStream::write_all(std::string_view data, Clock::time_point deadline) {
  const host::SigpipeBlocked quiet_pipe;
  while (!data.empty()) {
    ERR_clear_error();
    std::size_t put = 0;
    if (SSL_write_ex(ssl_, data.data(), data.size(), &put) == 1) {
      data.remove_prefix(put);
      continue;
    }
    const int error = SSL_get_error(ssl_, 0);
    if (!would_block(error)) throw WireError("TLS: " + explain(openssl_reasons()));
    if (!wait_for(error, deadline)) throw WireError("TLS: the peer did not read in time");
  }
}

void TlsStream::close_now() {
  const host::SigpipeBlocked quiet_pipe;
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

std::vector<std::string> TlsStream::peer_identities() const {
  std::vector<std::string> names;
  X509* certificate = SSL_get1_peer_certificate(ssl_);
  if (!certificate) return names;
  // Every common name (a subject may hold several: each is an identity, and two that map to
  // different uids are refused, whichever order they come in).
  if (X509_NAME* subject = X509_get_subject_name(certificate)) {
    for (int index = -1;
         (index = X509_NAME_get_index_by_NID(subject, NID_commonName, index)) >= 0;) {
      ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
      unsigned char* text = nullptr;
      const int length = ASN1_STRING_to_UTF8(&text, data);
      if (length > 0) names.emplace_back(reinterpret_cast<char*>(text), length);
      OPENSSL_free(text);
    }
  }
  auto* alternatives = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; alternatives && i < sk_GENERAL_NAME_num(alternatives); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(alternatives, i);
    if (name->type == GEN_DNS || name->type == GEN_URI || name->type == GEN_EMAIL) {
      const ASN1_IA5STRING* text = name->d.ia5;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                         ASN1_STRING_length(text));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* bytes = name->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = {};
      const int family = ASN1_STRING_length(bytes) == 4 ? AF_INET : AF_INET6;
      if (inet_ntop(family, ASN1_STRING_get0_data(bytes), text, sizeof text))
        names.emplace_back(text);
    }
  }
  GENERAL_NAMES_free(alternatives);
  X509_free(certificate);
  return names;
}

std::string TlsStream::peer_verification_failure(const TlsContext& context) const {
  X509* certificate = SSL_get0_peer_certificate(ssl_);  // kept in a resumed session too
  if (!certificate) return "no client certificate";
  X509_STORE_CTX* check = X509_STORE_CTX_new();
  if (!check) return "out of memory checking the client certificate";
  // The certificates the client sent besides its own: intermediates, if any (a resumed session
  // keeps them with the certificate).
  STACK_OF(X509)* sent = SSL_get_peer_cert_chain(ssl_);
  std::string failure;
  // The store carries the context's CRL flags, as at a handshake.
  if (X509_STORE_CTX_init(check, SSL_CTX_get_cert_store(context.get()), certificate, sent) != 1 ||
      X509_STORE_CTX_set_purpose(check, X509_PURPOSE_SSL_CLIENT) != 1) {
    failure = "cannot check the client certificate: " + openssl_reasons();
  } else if (X509_verify_cert(check) != 1) {
    failure = explain(X509_verify_cert_error_string(X509_STORE_CTX_get_error(check)));
  }
  X509_STORE_CTX_free(check);
  ERR_clear_error();
  return failure;
}

std::optional<HostPort> split_host_port(std::string_view text) {
  HostPort where;
  std::size_t colon;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return std::nullopt;
    where.host = std::string(text.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    where.host = std::string(text.substr(0, colon));
    if (where.host.find(':') != std::string::npos) return std::nullopt;  // a v6 address unbracketed
  }
  where.port = std::string(text.substr(colon + 1));
  if (where.host.empty() || where.port.empty() || where.port.size() > 5 ||
      where.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(where.port) == 0 || std::stoul(where.port) > 65535)
    return std::nullopt;
  return where;
}

host::UniqueFd connect_tcp(const HostPort& where, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string name = where.host + ":" + where.port;
  if (const int failed = getaddrinfo(where.host.c_str(), where.port.c_str(), &hints, &found))
    throw ServerRefused("unavailable", "cannot resolve " + name + ": " + gai_strerror(failed));
  std::string why = "no address";
  host::UniqueFd connected;
  for (addrinfo* entry = found; entry && !connected; entry = entry->ai_next) {
    host::UniqueFd socket(
        ::socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!socket) {
      why = "socket(): " + sys::errno_text(errno);
      continue;
    }
    if (::connect(socket.get(), entry->ai_addr, entry->ai_addrlen) == 0) {
      connected = std::move(socket);
      break;
    }
    if (errno != EINPROGRESS) {
      why = sys::errno_text(errno);
      continue;
    }
    pollfd entry_poll{socket.get(), POLLOUT, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || poll(&entry_poll, 1, static_cast<int>(left)) <= 0) {
      why = "no connection within the deadline";
      continue;
    }
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(socket.get(), SOL_SOCKET, SO_ERROR, &error, &size);
    if (error != 0) {
      why = sys::errno_text(error);
      continue;
    }
    connected = std::move(socket);
  }
  freeaddrinfo(found);
  if (!connected) throw ServerRefused("unavailable", "cannot connect to " + name + ": " + why);
  return connected;
}

}  // namespace rlm::server
