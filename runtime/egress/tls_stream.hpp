// TLS over one non-blocking socket, for the connections whose credential the host side adds
// (credential_connection.hpp): the handshake and every write wait at most until a deadline and end
// early when `stop_fd` turns readable; reads never wait. One thread owns a stream.
#pragma once

#include <openssl/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

namespace rlm::egress {

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

  enum class Read { data, none_yet, eof, failed };
  // What is decrypted and waiting, at most `buffer.size()` bytes into `buffer`, without waiting.
  Read read_some(std::span<std::uint8_t> buffer, std::size_t& got);
  // Whether a read_some() now may return data without the socket turning readable.
  bool buffered() const;
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
