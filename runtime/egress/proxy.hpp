// The host side of one sandbox's egress allowlist (docs/network.md): the listeners its network
// namespace handed over (netns/egress_capture.hpp), served from this process's own network
// namespace. One thread waits on all of them: a DNS datagram is answered there (dns_stub.hpp);
// each accepted connection gets a thread of its own (connection.hpp), at most
// `limits.connections` at once -- past that a connection is closed at once and counted as a
// `limit` denial. Nothing here trusts the sandbox: every read is bounded and every wait ends
// when the proxy stops.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "egress/credentials.hpp"
#include "egress/upstream.hpp"
#include "host/unique_fd.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::egress {

class EgressProxy {
 public:
  // `listeners`: listening TCP sockets and one UDP socket (DNS), all in the sandbox's network
  // namespace. `credentials`: the allowlist's injections, made before the sandbox was (its trust
  // store holds their CA); null when it has none. Throws Error when the proxy's thread or stop
  // signal cannot be made.
  EgressProxy(std::vector<host::UniqueFd> listeners, const Egress& egress,
              UpstreamSettings upstream, std::shared_ptr<const Credentials> credentials = nullptr);
  // stop().
  ~EgressProxy();
  EgressProxy(const EgressProxy&) = delete;
  EgressProxy& operator=(const EgressProxy&) = delete;

  // Ends every connection and stops answering; waits (bounded) for the connections' threads.
  // Idempotent.
  void stop();

  // From now on `narrower` is the list (a live session's narrowing; the caller checked that it
  // lets through nothing the list did not): DNS answers and new connections follow it, and open
  // connections it does not let through end. Returns how many ended.
  std::size_t narrow(const Egress& narrower);

  // What the sandbox did so far.
  NetworkAccount account() const;
  // The account's times count from now (a sandbox built ahead, at its launch).
  void restart_clock();

  // Connections being served now (tests: none is left once the sandbox is gone).
  std::size_t active_connections() const;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::thread loop_;
};

}  // namespace rlm::egress
