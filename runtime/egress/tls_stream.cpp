#include "egress/tls_stream.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include "egress/upstream.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::egress {
namespace {

using Clock = std::chrono::steady_clock;

// What the last call's error asks for: the socket event to wait for, or 0 when it failed.
short wanted(SSL* ssl, int result) {
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      return POLLIN;
    case SSL_ERROR_WANT_WRITE:
      return POLLOUT;
    default:
      return 0;
  }
}

std::string last_error() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "the connection ended";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

}  // namespace

TlsStream::TlsStream(SSL_CTX* context, int fd) : ssl_(SSL_new(context)), fd_(fd) {
  if (!ssl_ || SSL_set_fd(ssl_, fd) != 1) {
    SSL_free(ssl_);
    throw Error("egress: cannot make a TLS connection's state: " + last_error());
  }
}

TlsStream::~TlsStream() {
  SSL_free(ssl_);
}

bool TlsStream::handshake(bool server, int stop_fd, Deadline deadline, std::string& why) {
  for (;;) {
    ERR_clear_error();
    const int result = server ? SSL_accept(ssl_) : SSL_connect(ssl_);
    if (result == 1) return true;
    const short event = wanted(ssl_, result);
    if (event == 0) {
      why = last_error();
      if (!server && SSL_get_verify_result(ssl_) != X509_V_OK)
        why = std::string("certificate not trusted: ") +
              X509_verify_cert_error_string(SSL_get_verify_result(ssl_));
      return false;
    }
    // The deadline checked here too: poll() past it still reports a socket that is ready.
    if (Clock::now() >= deadline || !wait_for(fd_, event, stop_fd, deadline)) {
      why = "the handshake timed out";
      return false;
    }
  }
}

bool TlsStream::accept(int stop_fd, Deadline deadline, std::string& why) {
  return handshake(true, stop_fd, deadline, why);
}

bool TlsStream::connect(const std::string& host, int stop_fd, Deadline deadline, std::string& why) {
  if (SSL_set_tlsext_host_name(ssl_, host.c_str()) != 1 || SSL_set1_host(ssl_, host.c_str()) != 1 ||
      SSL_set_alpn_protos(ssl_, kAlpnHttp1, sizeof kAlpnHttp1) != 0) {
    why = last_error();
    return false;
  }
  SSL_set_hostflags(ssl_, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  return handshake(false, stop_fd, deadline, why);
}

short TlsStream::event_for(Read read) {
  return read == Read::wants_write ? POLLOUT : POLLIN;
}

TlsStream::Read TlsStream::read_some(std::span<std::uint8_t> buffer, std::size_t& got) {
  got = 0;
  ERR_clear_error();
  const int result = SSL_read_ex(ssl_, buffer.data(), buffer.size(), &got);
  if (result == 1) return Read::data;
  switch (SSL_get_error(ssl_, result)) {
    case SSL_ERROR_WANT_READ:
      return Read::wants_read;
    case SSL_ERROR_WANT_WRITE:
      return Read::wants_write;
    case SSL_ERROR_ZERO_RETURN:
      return Read::eof;
    case SSL_ERROR_SYSCALL:  // the peer closed without a close_notify: its end all the same
      ERR_clear_error();
      return Read::eof;
    default:
      ERR_clear_error();
      return Read::failed;
  }
}

bool TlsStream::write_all(std::span<const std::uint8_t> bytes, int stop_fd, Deadline deadline) {
  while (!bytes.empty()) {
    ERR_clear_error();
    std::size_t written = 0;
    const int result = SSL_write_ex(ssl_, bytes.data(), bytes.size(), &written);
    if (result == 1) {
      bytes = bytes.subspan(written);
      continue;
    }
    const short event = wanted(ssl_, result);
    if (event == 0 || Clock::now() >= deadline || !wait_for(fd_, event, stop_fd, deadline)) {
      ERR_clear_error();
      return false;
    }
  }
  return true;
}

void TlsStream::close() {
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace rlm::egress
