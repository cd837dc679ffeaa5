#include <cmath>
#include <cstddef>
#include <iterator>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {

std::string_view to_string(CellStatus status) {
  // Indexed by CellStatus, in its order; the last is the last enumerator.
  static constexpr std::string_view kNames[] = {"ok",           "error",   "timeout",
                                                "memory_limit", "crashed", "session_error"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(CellStatus::session_error) + 1);
  const auto index = static_cast<std::size_t>(status);
  return index < std::size(kNames) ? kNames[index] : "session_error";
}

nlohmann::json CellResult::to_json() const {
  const auto milliseconds = [](std::chrono::microseconds value) {
    return std::round(static_cast<double>(value.count()) / 10.0) / 100.0;
  };
  // Strings are kept as the worker sent them (valid UTF-8); printers dump with
  // error_handler_t::replace so nothing invalid can break a JSON line.
  nlohmann::json document = {
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
  if (answer) document["answer"] = *answer;
  if (locals) document["locals"] = *locals;
  if (fetched) document["fetched"] = *fetched;
  if (index) document["index"] = *index;
  if (saved) document["saved"] = *saved;
  if (network) document["network"] = network->to_json();
  return document;
}

}  // namespace rlm

namespace rlm {

std::optional<CellStatus> cell_status_from_string(std::string_view text) {
  for (auto status : {CellStatus::ok, CellStatus::error, CellStatus::timeout,
                      CellStatus::memory_limit, CellStatus::crashed, CellStatus::session_error})
    if (to_string(status) == text) return status;
  return std::nullopt;
}

CellResult cell_result_from_json(const nlohmann::json& document) {
  if (!document.is_object()) throw Error("a cell result must be a JSON object");
  const auto get = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json kNull;
    const auto found = document.find(key);
    return found == document.end() ? kNull : *found;
  };
  const auto text = [&](const char* key) {
    const auto& value = get(key);
    if (value.is_null()) return std::string();
    if (!value.is_string())
      throw Error(std::string("a cell result's \"") + key + "\" must be a string");
    return value.get<std::string>();
  };
  const auto flag = [&](const char* key) {
    const auto& value = get(key);
    if (value.is_null()) return false;
    if (!value.is_boolean())
      throw Error(std::string("a cell result's \"") + key + "\" must be a boolean");
    return value.get<bool>();
  };
  const auto micros = [&](const char* key) {
    const auto& value = get(key);
    if (value.is_null()) return std::chrono::microseconds(0);
    if (!value.is_number() || !(value.get<double>() >= 0) || value.get<double>() > 1e15)
      throw Error(std::string("a cell result's \"") + key + "\" must be a non-negative number");
    return std::chrono::microseconds(static_cast<std::int64_t>(value.get<double>() * 1000.0 + 0.5));
  };
  CellResult cell;
  const auto status = cell_status_from_string(text("status"));
  if (!status) throw Error("a cell result's \"status\" is not one of the statuses");
  cell.status = *status;
  cell.stdout_data = text("stdout");
  cell.stderr_data = text("stderr");
  cell.stdout_truncated = flag("stdout_truncated");
  cell.stderr_truncated = flag("stderr_truncated");
  cell.error = text("error");
  if (flag("has_final")) cell.final = get("final");
  cell.wall = micros("wall_ms");
  cell.cpu = micros("cpu_ms");
  const auto& calls = get("llm_calls");
  if (!calls.is_null()) {
    if (!calls.is_number_unsigned())
      throw Error("a cell result's \"llm_calls\" must be an integer");
    cell.llm_calls = calls.get<unsigned>();
  }
  cell.rolled_back = flag("rolled_back");
  if (const auto& answer = get("answer"); !answer.is_null()) cell.answer = text("answer");
  if (const auto& locals = get("locals"); !locals.is_null()) {
    if (!locals.is_array()) throw Error("a cell result's \"locals\" must be an array");
    cell.locals = locals;
  }
  if (const auto& network = get("network"); !network.is_null())
    cell.network = network_account_from_json(network);
  if (const auto& fetched = get("fetched"); !fetched.is_null()) {
    if (!fetched.is_object()) throw Error("a cell result's \"fetched\" must be an object");
    cell.fetched = fetched;
  }
  if (const auto& index = get("index"); !index.is_null()) {
    if (!index.is_number_unsigned())
      throw Error("a cell result's \"index\" must be a non-negative integer");
    cell.index = index.get<std::size_t>();
  }
  if (const auto& saved = get("saved"); !saved.is_null()) {
    if (!saved.is_object()) throw Error("a cell result's \"saved\" must be an object");
    cell.saved = saved;
  }
  return cell;
}

}  // namespace rlm
