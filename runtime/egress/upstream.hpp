// The host side's own way out (docs/network.md, "Upstream"): a name the sandbox may reach is
// resolved here -- by the resolver set with RLM_SANDBOX_RESOLVER=HOST:PORT (tests use a fake
// one), else the host's own (getaddrinfo) -- and one address is dialled from the host's network
// namespace. Every wait is bounded and ends early when `stop_fd` turns readable.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "egress/address.hpp"
#include "host/unique_fd.hpp"

namespace rlm::egress {

struct UpstreamSettings {
  std::optional<Endpoint> resolver;  // nullopt: the host's resolver
  std::chrono::milliseconds resolve_timeout{5000};
  std::chrono::milliseconds connect_timeout{10000};
  // Where injected credentials go (credentials.hpp), the CA bundle their upstreams are verified
  // against: RLM_SANDBOX_UPSTREAM_CA (tests: their fake upstreams' CA); "" is the host's store.
  std::string ca_file;

  // RLM_SANDBOX_RESOLVER and RLM_SANDBOX_UPSTREAM_CA when set (throws Error naming the first that
  // is not HOST:PORT or an absolute path).
  static UpstreamSettings from_environment();
};

// `name`'s IPv4 then IPv6 addresses; empty with `why` when it has none or the resolver failed.
std::vector<IpAddress> resolve(const UpstreamSettings& settings, const std::string& name,
                               int stop_fd, std::string& why);

// A connected, non-blocking TCP socket to `endpoint`; an empty fd with `why` otherwise.
host::UniqueFd connect_upstream(const UpstreamSettings& settings, const Endpoint& endpoint,
                                int stop_fd, std::string& why);

// Waits for `events` on `fd` until `deadline`; false on timeout, error or `stop_fd` readable.
bool wait_for(int fd, short events, int stop_fd, std::chrono::steady_clock::time_point deadline);

}  // namespace rlm::egress
