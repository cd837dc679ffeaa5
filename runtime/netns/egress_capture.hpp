// The sandbox's half of an egress allowlist (docs/network.md): in the sandbox's own network
// namespace every destination is made local -- `local 0.0.0.0/0` and `local ::/0` on lo, so no
// packet can leave and nothing needs a firewall -- and a listener is bound for each port the
// policy allows (TCP) and for DNS (TCP and UDP :53). Their fds go to the host side over a
// socketpair (SCM_RIGHTS) and the child's copies close before init runs: no code of ours stays
// inside. The host accepts on them from its own network namespace, where getsockname() of an
// accepted connection is the address the sandbox dialled. A port without a listener refuses at
// once (RST, or ICMP for UDP), so QUIC falls back to TCP.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "host/unique_fd.hpp"
#include "process/child_failure.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::netns {

// Why an allowlist cannot hold for a sandbox whose policy keeps CAP_NET_ADMIN or CAP_SYS_ADMIN
// while its namespaces belong to the host's user namespace (`own_user_namespace` false): it could
// take the routes down or move a network device into the host's namespace. "" when it can.
std::string capability_problem(const Policy& policy, bool own_user_namespace);

class EgressCapturePlan {
 public:
  // At most this many TCP ports (each range's ports count): one listener and fd each.
  static constexpr std::size_t kMaxPorts = 200;

  // Parent: the netlink routes, the ports (53 always), the socketpair. Throws Error naming the
  // policy's entries when they ask for more ports than kMaxPorts.
  static EgressCapturePlan prepare(const Egress& egress);

  // Child, in the new network namespace after lo is up, holding CAP_NET_ADMIN and
  // CAP_NET_BIND_SERVICE there: adds the routes, binds and listens, sends the fds, closes them.
  bool apply(process::ChildFailure& failure) const noexcept;

  // Parent, after the clone: its copy of the child's end goes.
  void close_child_end() { child_end_.reset(); }

  // Parent, for a network namespace that exists already (a container's, `netns_fd` open on it):
  // applies the plan from a thread of this process that joins it (setns moves that thread
  // only; it needs CAP_SYS_ADMIN over the namespace), then receives. Throws Error naming the
  // step that failed.
  std::vector<host::UniqueFd> capture_in(int netns_fd,
                                         std::chrono::steady_clock::time_point deadline);

  // Parent: the listeners the child sent, TCP ones in ports() order then the UDP one on 53, each
  // checked to be the socket it claims (type, listening, port). Waits at most until `deadline`;
  // throws Error when the child sent none (it failed first: its error pipe says why) or others.
  std::vector<host::UniqueFd> receive(std::chrono::steady_clock::time_point deadline);

  const std::vector<std::uint16_t>& ports() const { return ports_; }  // TCP, ascending, 53 in

 private:
  // apply(), sending on (and then closing) `child_end`.
  bool apply_through(int child_end, process::ChildFailure& failure) const noexcept;

  std::vector<std::uint8_t> route_v4_, route_v6_;  // RTM_NEWROUTE requests, NLM_F_ACK set
  std::vector<std::uint8_t> loopback_segment_;     // RTM_NEWLINK for lo, NLM_F_ACK set
  std::vector<std::uint16_t> ports_;
  host::UniqueFd host_end_, child_end_;  // SOCK_SEQPACKET; the child's is close-on-exec
};

}  // namespace rlm::netns
