#include "server/event_log.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace rlm::server {
namespace {

using nlohmann::json;

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.tm_year + 1900,
                parts.tm_mon + 1, parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec,
                static_cast<int>(millis));
  return text;
}

void bound_strings(json& value, int depth) {
  if (value.is_string()) {
    auto& text = value.get_ref<std::string&>();
    if (text.size() > EventLog::kMaxText) {
      const std::size_t size = text.size();
      text.resize(EventLog::kMaxText);
      text += "... (" + std::to_string(size) + " bytes)";
    }
  } else if ((value.is_object() || value.is_array()) && depth < 4) {
    for (auto& item : value) bound_strings(item, depth + 1);
  } else if (value.is_object() || value.is_array()) {
    value = "(nested too deep)";
  }
}

}  // namespace

void EventLog::record(json event) const noexcept {
  if (!sink_) return;
  try {
    bound_strings(event, 0);
    // In this order: time, event, then the rest by name (for a person reading the journal).
    nlohmann::ordered_json line = nlohmann::ordered_json::object();
    line["time"] = utc_now();
    if (event.contains("event")) line["event"] = nlohmann::ordered_json(event["event"]);
    for (const auto& [key, value] : event.items())
      if (key != "event") line[key] = nlohmann::ordered_json(value);
    // ASCII only: no control character of any encoding reaches a terminal that shows the log.
    sink_(line.dump(-1, ' ', true, nlohmann::ordered_json::error_handler_t::replace));
  } catch (...) {
  }
}

void EventLog::record_limited(json event, std::optional<std::uint32_t> uid) const noexcept {
  if (!sink_) return;
  constexpr std::size_t kMaxWindows = 4096;
  const std::uint64_t key = uid ? *uid : ~std::uint64_t{0};
  const auto now = std::chrono::steady_clock::now();
  std::uint64_t left_out = 0;
  try {
    {
      std::lock_guard lock(mutex_);
      if (windows_.size() >= kMaxWindows && !windows_.count(key)) {
        // Forget the windows that are over; past that, one shared window for the rest.
        std::erase_if(windows_, [&](const auto& entry) {
          return now - entry.second.start >= std::chrono::seconds(1) &&
                 entry.second.suppressed == 0;
        });
      }
      Window& window = windows_.size() < kMaxWindows || windows_.count(key)
                           ? windows_[key]
                           : windows_[~std::uint64_t{0} - 1];
      if (now - window.start >= std::chrono::seconds(1)) {
        window.start = now;
        window.written = 0;
      }
      if (window.written >= kLimitedPerSecond) {
        ++window.suppressed;
        return;
      }
      ++window.written;
      left_out = std::exchange(window.suppressed, 0);
    }
    if (left_out) event["suppressed"] = left_out;
    record(std::move(event));
  } catch (...) {
  }
}

}  // namespace rlm::server
