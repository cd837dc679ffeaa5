// A TLS ClientHello as the egress proxy peeks it from a sandbox's connection (RFC 8446 4.1.2,
// RFC 6066 server_name, draft-ietf-tls-esni encrypted_client_hello): which server name it asks
// for, and whether it hides one. Pure over bytes; every length is checked against what encloses
// it, and a hello split across several TLS records is reassembled up to `max_bytes`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace rlm::protocols {

constexpr std::uint16_t kTlsExtensionServerName = 0, kTlsExtensionEch = 0xfe0d,
                        kTlsExtensionEsni = 0xffce;

enum class HelloVerdict {
  need_more,  // a prefix of a valid hello: read more (up to max_bytes)
  complete,   // `hello` filled
  not_tls,    // the first bytes are not a TLS handshake record carrying a ClientHello
  malformed,  // a TLS record, but lengths or fields that do not add up
  too_large,  // the hello goes past max_bytes
};

struct ClientHello {
  std::optional<std::string> server_name;  // the host_name entry, lowercased, trailing dot
                                           // removed; nullopt: no server_name extension
  bool encrypted_client_hello = false;     // encrypted_client_hello (0xfe0d, drafts
                                           // 0xfe08-0xfe0c) or ESNI (0xffce)
  bool server_name_invalid = false;        // an SNI present but not one host_name of 1..255
                                           // bytes of LDH, '.', '_' (or several host_names)
  std::size_t bytes = 0;                   // how many bytes of the stream the records took
};

// `stream`: the first bytes the client sent. need_more until the whole hello (all the records
// holding it) is there.
HelloVerdict parse_client_hello(std::span<const std::uint8_t> stream, std::size_t max_bytes,
                                ClientHello& hello);

}  // namespace rlm::protocols
