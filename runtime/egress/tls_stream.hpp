// TLS over one non-blocking socket, for the connections whose credential the host side adds
// (credential_connection.hpp): the handshake and every write wait at most until a deadline and end
// early when `stop_fd` turns readable; reads never wait. One thread owns a stream.
#pragma once

#include <openssl/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "host/sigpipe_blocked.hpp"

namespace rlm::egress {

// The one protocol spoken where credentials are added, as ALPN writes it.
inline constexpr unsigned char kAlpnHttp1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

// SIGPIPE while a stream writes: host/sigpipe_blocked.hpp.
using host::SigpipeBlocked;

class TlsStream {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  // Throws Error when OpenSSL cannot make the connection's state.
  TlsStream(SSL_CTX* context, int fd);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // The server's handshake (the sandbox's side).
  bool accept(int stop_fd, Deadline deadline, std::string& why);
  // The client's handshake to `host`: SNI, ALPN http/1.1, the certificate verified for `host`.
  bool connect(const std::string& host, int stop_fd, Deadline deadline, std::string& why);

  // wants_read / wants_write: nothing decrypted waits, and OpenSSL goes on only once the socket
  // turns readable (or writable: a TLS 1.3 KeyUpdate to answer, a peer that does not read) --
  // wait on that, never on OpenSSL's buffers (a partial record held back would keep a caller
  // spinning).
  enum class Read { data, wants_read, wants_write, eof, failed };
  // What is decrypted and waiting, at most `buffer.size()` bytes into `buffer`, without waiting.
  Read read_some(std::span<std::uint8_t> buffer, std::size_t& got);
  // The poll() event a wants_read or wants_write asks for.
  static short event_for(Read read);
  // Every byte of `bytes`, waiting as the socket lets it.
  bool write_all(std::span<const std::uint8_t> bytes, int stop_fd, Deadline deadline);
  // A close_notify, without waiting for the peer's.
  void close();

  int fd() const { return fd_; }

 private:
  bool handshake(bool server, int stop_fd, Deadline deadline, std::string& why);
  SSL* ssl_;
  int fd_;
};

}  // namespace rlm::egress
