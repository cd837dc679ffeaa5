// The allowlist one sandbox's host side enforces now, and the connections it let through: a
// session's allowlist may be narrowed while it runs (Session::narrow_network). A narrower list
// holds for every DNS answer and connection check from then on, and the open connections it no
// longer lets through are ended at once (both sockets shut down), so that nothing the sandbox
// opened before outlives the narrowing. The list only ever narrows: the caller checks that.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "egress/address.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {

class LiveRules {
 public:
  explicit LiveRules(const Egress& egress) : current_(std::make_shared<const Egress>(egress)) {}

  // The list as it is now; a connection checks against one snapshot from start to relay.
  std::shared_ptr<const Egress> current() const;

  // An allowed connection about to be relayed: its name (when it was dialled by one) or address,
  // its port, and its two sockets (open until forget()). Refused (false) when the list as it is
  // now no longer lets it through: it was checked against a snapshot a narrowing replaced.
  struct Open {
    std::optional<std::string> name;
    IpAddress address;
    std::uint16_t port = 0;
    int client = -1, upstream = -1;
  };
  [[nodiscard]] std::optional<std::uint64_t> admit(const Open& connection);
  // Before its sockets close: a later narrowing must not shut down fds that were reused.
  void forget(std::uint64_t token);

  // Replaces the list; ends the open connections it does not let through. Returns how many.
  std::size_t replace(const Egress& narrower);

 private:
  bool lets_through(const Egress& egress, const Open& connection) const;

  mutable std::mutex mutex_;
  std::shared_ptr<const Egress> current_;
  std::map<std::uint64_t, Open> open_;
  std::uint64_t next_token_ = 1;
};

}  // namespace rlm::egress
