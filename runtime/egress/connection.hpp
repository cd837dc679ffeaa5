// One TCP connection the sandbox made, from accept to close (docs/network.md, "Per connection"):
// its destination says what it may be -- a synthetic address is the name the sandbox's DNS bound
// to it, checked with the port against the name entries; any other address is checked against
// the CIDR entries -- then, for a name, its first bytes must agree (the ClientHello's SNI on TLS
// ports, the Host of one HTTP request on http:// entries); the host side resolves the name itself,
// refuses private answers, dials one pinned address and relays. Everything refused is one entry
// in the account with its kind. TCP to port 53 that no entry allows is the sandbox's DNS.
#pragma once

#include "egress/account.hpp"
#include "egress/dns_stub.hpp"
#include "egress/live_rules.hpp"
#include "egress/synthetic_names.hpp"
#include "egress/upstream.hpp"
#include "host/unique_fd.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

// An HTTP request head the host side reads (an http:// entry's, an injected host's): its bytes
// and header lines at most.
inline constexpr std::size_t kMaxHttpHead = 16384, kMaxHttpHeaders = 100;

struct ConnectionContext {
  const Egress& egress;  // the list as it was when the connection came (rules.current())
  LiveRules& rules;      // as it is now: the relay starts only if it still lets it through
  SyntheticNames& names;
  Account& account;
  DnsStub& dns;
  const UpstreamSettings& upstream;
  int stop_fd;
  const class Credentials* credentials = nullptr;  // an allowlist's injections, when it has any
};

// `client`: accepted from a listener in the sandbox's network namespace, non-blocking.
void serve_connection(const ConnectionContext& context, host::UniqueFd client);

// The upstream address for `name`: the first answer no deny entry covers and that is public,
// unless "private" or a CIDR entry lets it be private. nullopt once the denial is recorded.
std::optional<Endpoint> pick_upstream(const ConnectionContext& context, const std::string& name,
                                      const std::string& destination, std::uint16_t port);

}  // namespace rlm::egress
