#include "egress/account.hpp"

#include <algorithm>

namespace rlm::egress {

const char* to_string(Denial denial) {
  switch (denial) {
    case Denial::dns:
      return "dns";
    case Denial::no_rule:
      return "no_rule";
    case Denial::sni_mismatch:
      return "sni_mismatch";
    case Denial::host_mismatch:
      return "host_mismatch";
    case Denial::ech:
      return "ech";
    case Denial::private_address:
      return "private_address";
    case Denial::not_tls:
      return "not_tls";
    case Denial::protocol:
      return "protocol";
    case Denial::limit:
      return "limit";
    case Denial::upstream:
      return "upstream";
  }
  return "unknown";
}

void Account::deny(Denial kind, std::string name, std::string destination, std::uint16_t port) {
  if (name.size() > kMaxNameBytes) name.resize(kMaxNameBytes);
  const std::string kind_text = to_string(kind);
  std::lock_guard lock(mutex_);
  for (auto& entry : account_.denied)
    if (entry.kind == kind_text && entry.name == name && entry.destination == destination &&
        entry.port == port) {
      ++entry.count;
      return;
    }
  // Past the cap a kind not seen yet still gets its one entry (a handful at most): a flood of
  // one kind cannot hide that another happened.
  const bool kind_seen =
      std::any_of(account_.denied.begin(), account_.denied.end(),
                  [&](const NetworkDenied& entry) { return entry.kind == kind_text; });
  if (account_.denied.size() >= kMaxDenied) {
    account_.truncated = true;
    if (kind_seen) return;
  }
  account_.denied.push_back({kind_text, std::move(name), std::move(destination), port, 1});
}

long Account::allow(std::string name, std::string address, std::uint16_t port, std::string rule) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  if (account_.allowed.size() >= kMaxAllowed) {
    account_.truncated = true;
    return -1;
  }
  NetworkAllowed entry;
  entry.at = std::chrono::duration_cast<std::chrono::milliseconds>(now - started_);
  entry.name = std::move(name);
  entry.address = std::move(address);
  entry.port = port;
  entry.rule = std::move(rule);
  account_.allowed.push_back(std::move(entry));
  opened_.push_back(now);
  return static_cast<long>(account_.allowed.size() - 1);
}

void Account::finish(long index, std::uint64_t bytes_out, std::uint64_t bytes_in) {
  if (index < 0) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  auto& entry = account_.allowed.at(static_cast<std::size_t>(index));
  entry.bytes_out = bytes_out;
  entry.bytes_in = bytes_in;
  entry.duration = std::chrono::duration_cast<std::chrono::milliseconds>(
      now - opened_[static_cast<std::size_t>(index)]);
}

void Account::dns_answered() {
  std::lock_guard lock(mutex_);
  ++account_.dns_answered;
}

void Account::dns_refused() {
  std::lock_guard lock(mutex_);
  ++account_.dns_refused;
}

void Account::restart_clock() {
  std::lock_guard lock(mutex_);
  started_ = std::chrono::steady_clock::now();
}

NetworkAccount Account::snapshot() const {
  std::lock_guard lock(mutex_);
  return account_;
}

}  // namespace rlm::egress
