// The server's account of what it does: one JSON object per line for each request, refusal and
// end (ServerConfig::log; `rlm-sandbox serve` writes them to stderr, where journald keeps them
// under the shipped unit). What a client sent is hostile: every string is cut to a bound and any
// byte that is not UTF-8 replaced, so a line is always one line of valid JSON of bounded size.
#pragma once

#include <functional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rlm::server {

class EventLog {
 public:
  // Longest string kept in a line; a longer one ends in "... (N bytes)".
  static constexpr std::size_t kMaxText = 1024;

  explicit EventLog(std::function<void(std::string_view line)> sink) : sink_(std::move(sink)) {}

  // Writes `event` with "time" (UTC, RFC 3339 with milliseconds) first. No sink: nothing.
  // Never throws: the log must not end a client's request.
  void record(nlohmann::json event) const noexcept;

 private:
  std::function<void(std::string_view)> sink_;
};

}  // namespace rlm::server
