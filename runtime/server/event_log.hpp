// The server's account of what it does: one JSON object per line for each request, refusal and
// end (ServerConfig::log; `rlm-sandbox serve` writes them to stderr, where journald keeps them
// under the shipped unit). What a client sent is hostile: every string is cut to a bound and any
// byte that is not UTF-8 replaced, so a line is always one line of valid JSON of bounded size.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rlm::server {

class EventLog {
 public:
  // Longest string kept in a line; a longer one ends in "... (N bytes)".
  static constexpr std::size_t kMaxText = 1024;

  explicit EventLog(std::function<void(std::string_view line)> sink) : sink_(std::move(sink)) {}

  // Lines one uid's refusals and cheap requests (status, kill) may take per second; the rest are
  // counted, and the next line of theirs that is written says how many were left out
  // ("suppressed"). A tenant refused or polling in a loop cannot flood the log (journald's own
  // rate limit would then drop everyone's lines). Runs and sessions, each a sandbox, all count.
  static constexpr std::uint32_t kLimitedPerSecond = 20;

  // Writes `event` with "time" (UTC, RFC 3339 with milliseconds) first. No sink: nothing.
  // Never throws: the log must not end a client's request.
  void record(nlohmann::json event) const noexcept;
  // A refusal's or a cheap request's line, within the rate above for `uid` (nullopt: a peer
  // whose uid is unknown).
  void record_limited(nlohmann::json event, std::optional<std::uint32_t> uid) const noexcept;

 private:
  struct Window {
    std::chrono::steady_clock::time_point start;
    std::uint32_t written = 0;
    std::uint64_t suppressed = 0;
  };
  std::function<void(std::string_view)> sink_;
  mutable std::mutex mutex_;
  mutable std::map<std::uint64_t, Window> windows_;  // by uid; at most kMaxWindows
};

}  // namespace rlm::server
