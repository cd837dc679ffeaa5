// The allowlist one sandbox's host side enforces now, and the connections it let in: a session's
// allowlist may be narrowed while it runs (Session::narrow_network). A narrower list holds for
// every DNS answer and connection check from then on, and every connection it no longer lets
// through is ended at once (both sockets shut down) -- one still being checked before it resolves
// or dials anything, one being relayed whatever it carries -- so that nothing the sandbox opened
// before outlives the narrowing. A connection is judged on all it passed: its (name, port) or
// address, the checks its rule asked for then (a TLS hello, an HTTP request), and the upstream
// address it was pinned to. The list only ever narrows: the caller checks that.
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

  // The list as it is now; a connection is checked against one snapshot, then against the list
  // as it is at each step below.
  std::shared_ptr<const Egress> current() const;

  // A connection the sandbox made, from accept: its destination's name (when it was dialled by
  // one) or address, its port, and its socket (open until forget()). nullopt when the list as it
  // is now does not let (name | address, port) through.
  [[nodiscard]] std::optional<std::uint64_t> enter(const std::optional<std::string>& name,
                                                   const IpAddress& address, std::uint16_t port,
                                                   int client);
  // Whether a narrowing since has ended it: nothing more is to be resolved, dialled or relayed.
  bool ended(std::uint64_t token) const;

  // What it passed before its relay: the checks (a ClientHello, one HTTP request) and the upstream
  // it was pinned to, with that socket. False when the list as it is now does not let all of that
  // through (a narrowing came after its checks). The upstream socket stays registered until
  // release_upstream(), before it closes.
  struct Passed {
    bool tls = false, http = false;  // the ClientHello's name, the request's Host
    IpAddress upstream;
    int upstream_fd = -1;
  };
  [[nodiscard]] bool admit(std::uint64_t token, const Passed& passed);
  void release_upstream(std::uint64_t token);
  // Before its client socket closes.
  void forget(std::uint64_t token);

  // Replaces the list; ends the connections it does not let through. Returns how many.
  std::size_t replace(const Egress& narrower);

 private:
  struct Open {
    std::optional<std::string> name;
    IpAddress address;
    std::uint16_t port = 0;
    int client = -1;
    std::optional<Passed> passed;  // set by admit()
    bool ended = false;
  };
  static bool lets_through(const Egress& egress, const Open& connection);
  static void end(Open& connection);

  mutable std::mutex mutex_;
  std::shared_ptr<const Egress> current_;
  std::map<std::uint64_t, Open> open_;
  std::uint64_t next_token_ = 1;
};

}  // namespace rlm::egress
