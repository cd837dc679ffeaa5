// HTTP/1.x requests as the egress proxy meets them on an http:// entry (RFC 9112): the request
// line and headers of each request on a connection, and where each body ends, so that every
// request is checked before a byte of it is relayed. Pure over bytes; bounded by the caller's
// limits; anything ambiguous (both Content-Length and Transfer-Encoding, two Content-Lengths
// that differ, obs-fold, bare CR, a Transfer-Encoding other than a final "chunked") is malformed,
// since a request the proxy and the upstream could split differently is a smuggling channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rlm::protocols {

struct HttpRequestHead {
  std::string method;     // as sent (token chars)
  std::string target;     // request-target as sent
  int version_minor = 1;  // HTTP/1.0 or HTTP/1.1
  std::string host;       // the Host header's name: lowercased, port and trailing dot
                          // removed; "" when absent
  std::optional<std::uint16_t> host_port;  // its port when given
  bool absolute_form = false;              // target "http://name[:port]/..." (a proxy request)
  std::string absolute_host;               // that name, lowercased (absolute_form only)
  bool upgrade = false;                    // an Upgrade header, or Connection: upgrade
  bool connection_close = false;           // Connection: close present
  std::size_t head_bytes = 0;              // request line + headers + the blank line
  // The body: its length when Content-Length, chunked when Transfer-Encoding: chunked, else
  // none (0 bytes).
  bool chunked = false;
  std::uint64_t content_length = 0;
};

enum class HttpVerdict { need_more, complete, malformed, too_large };

// The head at the start of `bytes` (request line, headers, CRLF CRLF; a bare LF line end is
// accepted as RFC 9112 allows). too_large when no complete head fits in `max_head_bytes`, or it
// has more than `max_headers` header lines. `why` says what is malformed.
HttpVerdict parse_http_request_head(std::span<const std::uint8_t> bytes, std::size_t max_head_bytes,
                                    std::size_t max_headers, HttpRequestHead& head,
                                    std::string& why);

// The same head to send upstream: request line and headers as received, except every
// Connection, Keep-Alive, Proxy-Connection and Upgrade header is dropped and "Connection: close"
// added, and `extra` headers ("Name: value" each, no CRLF) appended; every header named in
// `replaced` (any case) is dropped too. Ends with the blank line.
std::vector<std::uint8_t> rewrite_http_request_head(std::span<const std::uint8_t> head_bytes,
                                                    const std::vector<std::string>& extra,
                                                    const std::vector<std::string>& replaced = {});

// Walks a request body as it streams by, to find where it ends (so a second request cannot hide
// in the first one's body). Feed it bytes after the head; it says how many belong to the body.
class HttpBodyFramer {
 public:
  explicit HttpBodyFramer(const HttpRequestHead& head);
  // How many of `bytes` (a prefix) belong to this body; done() once the body (for chunked, the
  // last chunk and its trailers) is complete. nullopt: malformed chunk framing (`why` says),
  // including a chunk line or trailer ended by a bare LF (the head goes upstream rewritten with
  // CRLF, the body as it came, so a bare LF there is one the upstream could read otherwise);
  // once malformed, every later feed is too.
  std::optional<std::size_t> feed(std::span<const std::uint8_t> bytes, std::string& why);
  bool done() const { return done_; }

 private:
  enum class State {
    length,
    chunk_size,
    chunk_ext,
    chunk_size_lf,
    chunk_data,
    chunk_data_cr,
    chunk_data_lf,
    trailer_start,
    trailer_line,
    trailer_lf,
    final_lf
  };
  bool chunked_ = false;
  bool done_ = false;
  bool failed_ = false;     // malformed once: every later feed says so too
  std::uint64_t left_ = 0;  // bytes left of the body or of the current chunk
  State state_ = State::length;
  int size_digits_ = 0;
  std::size_t extension_bytes_ = 0;  // of the current chunk-size line's extensions
  std::size_t trailer_bytes_ = 0;    // of all the trailer lines so far
};

}  // namespace rlm::protocols
