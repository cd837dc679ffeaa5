// A connection to a host whose credentials the host side injects (credentials.hpp), once its
// ClientHello's SNI was checked (and left unread): the host side ends the sandbox's TLS with the
// sandbox's own CA, reads one HTTP/1.1 request, drops any header of the injected names the sandbox
// sent and adds the real ones (and "Connection: close"), then opens its own verified TLS to the
// pinned upstream and relays that request's body and the response -- one request, no more.
// Every read and wait is bounded like the rest of the proxy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "egress/connection.hpp"
#include "egress/credentials.hpp"

namespace rlm::egress {

struct CredentialTarget {
  std::string name, destination;  // the name the sandbox dialled, the address it dialled it by
  std::uint16_t port = 0;
  std::string rule;     // the allow entry's text, for the account
  std::uint64_t token;  // LiveRules' for this connection
};

void serve_with_credentials(const ConnectionContext& context, int client,
                            const CredentialTarget& target,
                            const std::vector<const Injection*>& injections);

}  // namespace rlm::egress
