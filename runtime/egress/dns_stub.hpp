// The sandbox's DNS, answered on the host side (docs/network.md, "DNS"): an allowed name's A
// query gets the synthetic address bound to it, its other types an empty answer (so no AAAA, no
// HTTPS/SVCB records and with them no ECH configs), a PTR for a bound address its name, and
// anything else NXDOMAIN. No query ever leaves the host from here: the upstream is asked only
// when a connection to an allowed name is made (connection.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "egress/account.hpp"
#include "egress/live_rules.hpp"
#include "egress/synthetic_names.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

class DnsStub {
 public:
  static constexpr std::uint32_t kTtlSeconds = 300;

  // Each answer follows the list as it is at that moment (a live session's may narrow).
  DnsStub(const LiveRules& rules, SyntheticNames& names, Account& account)
      : rules_(rules), names_(names), account_(account) {}

  // The answer to one message from the sandbox (a UDP datagram, or a TCP frame's body); empty
  // when not even its id could be read (nothing is sent then).
  std::vector<std::uint8_t> answer(std::span<const std::uint8_t> message);

 private:
  const LiveRules& rules_;
  SyntheticNames& names_;
  Account& account_;
};

}  // namespace rlm::egress
