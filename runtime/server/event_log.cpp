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
    sink_(line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  } catch (...) {
  }
}

}  // namespace rlm::server
