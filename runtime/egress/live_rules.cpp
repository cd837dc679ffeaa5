#include "egress/live_rules.hpp"

#include <sys/socket.h>

#include "egress/rules.hpp"

namespace rlm::egress {

std::shared_ptr<const Egress> LiveRules::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

bool LiveRules::lets_through(const Egress& egress, const Open& connection) const {
  return connection.name ? rule_for_name(egress, *connection.name, connection.port) != nullptr
                         : rule_for_address(egress, connection.address, connection.port) != nullptr;
}

std::optional<std::uint64_t> LiveRules::admit(const Open& connection) {
  std::lock_guard lock(mutex_);
  if (!lets_through(*current_, connection)) return std::nullopt;
  const std::uint64_t token = next_token_++;
  open_.emplace(token, connection);
  return token;
}

void LiveRules::forget(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  open_.erase(token);
}

std::size_t LiveRules::replace(const Egress& narrower) {
  std::lock_guard lock(mutex_);
  current_ = std::make_shared<const Egress>(narrower);
  std::size_t ended = 0;
  for (auto it = open_.begin(); it != open_.end();) {
    if (lets_through(*current_, it->second)) {
      ++it;
      continue;
    }
    // The relay sees both ends close and finishes the connection's account entry; the fds stay
    // open (and theirs) until its forget().
    shutdown(it->second.client, SHUT_RDWR);
    shutdown(it->second.upstream, SHUT_RDWR);
    it = open_.erase(it);
    ++ended;
  }
  return ended;
}

}  // namespace rlm::egress
