// Reading the fields of a frame the sandbox sent: a field of the wrong type reads as absent, so
// nothing here throws on hostile input (nlohmann's value() would, for a present field of another
// type), and numbers are clamped before any conversion.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rlm::session {

// The field, or null when absent (never inserts).
inline const nlohmann::json& field(const nlohmann::json& frame, std::string_view key) {
  static const nlohmann::json kAbsent;
  if (!frame.is_object()) return kAbsent;
  const auto found = frame.find(key);
  return found == frame.end() ? kAbsent : *found;
}

// A string field, or "" when absent or not a string.
inline std::string text_field(const nlohmann::json& frame, std::string_view key) {
  const auto& value = field(frame, key);
  return value.is_string() ? value.get<std::string>() : std::string();
}

// A boolean field, false unless it is `true`.
inline bool flag_field(const nlohmann::json& frame, std::string_view key) {
  const auto& value = field(frame, key);
  return value.is_boolean() && value.get<bool>();
}

// A number field as a count of milliseconds, clamped to [0, max_ms]; 0 when absent or not a
// number.
inline double milliseconds_field(const nlohmann::json& frame, std::string_view key, double max_ms) {
  const auto& value = field(frame, key);
  if (!value.is_number()) return 0;
  const double ms = value.get<double>();
  if (!std::isfinite(ms) || ms <= 0) return 0;
  return ms < max_ms ? ms : max_ms;
}

}  // namespace rlm::session
