#include "egress/live_rules.hpp"

#include <sys/socket.h>

#include "egress/rules.hpp"

namespace rlm::egress {

std::shared_ptr<const Egress> LiveRules::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

bool LiveRules::lets_through(const Egress& egress, const Open& connection) {
  const NetworkRule* rule = connection.name
                                ? rule_for_name(egress, *connection.name, connection.port)
                                : rule_for_address(egress, connection.address, connection.port);
  if (!rule) return false;
  if (!connection.passed) return true;  // still being checked: what it passes is judged later
  const Passed& passed = *connection.passed;
  // A rule that asks for more than the connection was checked for (NAME:80 narrowed to
  // http://NAME) does not let through what it carries unchecked.
  if (connection.name && expects_tls(*rule, connection.port) && !passed.tls) return false;
  if (connection.name && rule->scheme == NetworkRule::Scheme::http && !passed.http) return false;
  // Its pinned upstream as the list would pick it now: not denied, and public unless "private"
  // or a CIDR entry lets it be private.
  if (address_denied(egress, passed.upstream, connection.port)) return false;
  return !is_private(passed.upstream) || egress.allow_private ||
         rule_for_address(egress, passed.upstream, connection.port) != nullptr;
}

void LiveRules::end(Open& connection) {
  // The check or the relay sees its sockets end and finishes; the fds stay open (and theirs)
  // until release_upstream() and forget().
  connection.ended = true;
  shutdown(connection.client, SHUT_RDWR);
  if (connection.passed && connection.passed->upstream_fd >= 0)
    shutdown(connection.passed->upstream_fd, SHUT_RDWR);
}

std::optional<std::uint64_t> LiveRules::enter(const std::optional<std::string>& name,
                                              const IpAddress& address, std::uint16_t port,
                                              int client) {
  std::lock_guard lock(mutex_);
  Open connection{name, address, port, client, std::nullopt, false};
  if (!lets_through(*current_, connection)) return std::nullopt;
  const std::uint64_t token = next_token_++;
  open_.emplace(token, std::move(connection));
  return token;
}

bool LiveRules::ended(std::uint64_t token) const {
  std::lock_guard lock(mutex_);
  const auto found = open_.find(token);
  return found == open_.end() || found->second.ended;
}

bool LiveRules::admit(std::uint64_t token, const Passed& passed) {
  std::lock_guard lock(mutex_);
  const auto found = open_.find(token);
  if (found == open_.end() || found->second.ended) return false;
  found->second.passed = passed;
  if (lets_through(*current_, found->second)) return true;
  found->second.passed->upstream_fd = -1;  // the caller closes it
  found->second.ended = true;
  return false;
}

void LiveRules::release_upstream(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  if (const auto found = open_.find(token); found != open_.end() && found->second.passed)
    found->second.passed->upstream_fd = -1;
}

void LiveRules::forget(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  open_.erase(token);
}

std::size_t LiveRules::replace(const Egress& narrower) {
  std::lock_guard lock(mutex_);
  current_ = std::make_shared<const Egress>(narrower);
  std::size_t ended = 0;
  for (auto& [token, connection] : open_) {
    if (connection.ended || lets_through(*current_, connection)) continue;
    end(connection);
    ++ended;
  }
  return ended;
}

}  // namespace rlm::egress
