#include <cmath>

#include "rlm_sandbox/session.hpp"

namespace rlm {

std::string_view to_string(CellStatus status) {
  switch (status) {
    case CellStatus::ok:
      return "ok";
    case CellStatus::error:
      return "error";
    case CellStatus::timeout:
      return "timeout";
    case CellStatus::memory_limit:
      return "memory_limit";
    case CellStatus::crashed:
      return "crashed";
    case CellStatus::session_error:
      return "session_error";
  }
  return "session_error";
}

nlohmann::json CellResult::to_json() const {
  const auto milliseconds = [](std::chrono::microseconds value) {
    return std::round(static_cast<double>(value.count()) / 10.0) / 100.0;
  };
  // Strings are kept as the worker sent them (valid UTF-8); printers dump with
  // error_handler_t::replace so nothing invalid can break a JSON line.
  return {
      {"status", to_string(status)},
      {"stdout", stdout_data},
      {"stderr", stderr_data},
      {"stdout_truncated", stdout_truncated},
      {"stderr_truncated", stderr_truncated},
      {"error", error.empty() ? nlohmann::json() : nlohmann::json(error)},
      {"final", final ? *final : nlohmann::json()},
      {"has_final", final.has_value()},
      {"wall_ms", milliseconds(wall)},
      {"cpu_ms", milliseconds(cpu)},
      {"llm_calls", llm_calls},
      {"rolled_back", rolled_back},
  };
}

}  // namespace rlm
