// Typed reads from a JSON document that never stop at the first problem: each failed read records
// a Diagnostic at its JSON path and returns nullopt, and the caller carries on with the rest.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"

namespace rlm::policy {

// "a string (\"yes\")", "an array", "null": how a wrong value is named in messages.
std::string describe(const nlohmann::json& value);
// "a string", "an array", "null": the kind of a value without any of its content, for values that
// may come from a file the policy had no business quoting (the document root).
std::string describe_type(const nlohmann::json& value);

class JsonReader {
 public:
  void error(std::string path, std::string message);
  std::vector<Diagnostic>& diagnostics() { return diagnostics_; }

  // When no allowed key is close to an unknown one, this may suggest where it belongs instead
  // ("memory_bytes" at the top level -> "limits.memory_bytes").
  using KeyHint = std::function<std::optional<std::string>(std::string_view key)>;

  // True when `value` is an object; reports every key not in `allowed`, with a did-you-mean.
  bool object(const nlohmann::json& value, const std::string& path,
              std::span<const std::string_view> allowed, const KeyHint& hint = {});
  // True when `value` is an object; any keys allowed (env.set).
  bool free_form_object(const nlohmann::json& value, const std::string& path);
  bool array(const nlohmann::json& value, const std::string& path);
  std::optional<bool> boolean(const nlohmann::json& value, const std::string& path);
  std::optional<std::string> string(const nlohmann::json& value, const std::string& path);
  // A whole number in [min, max].
  std::optional<std::uint64_t> integer(const nlohmann::json& value, const std::string& path,
                                       std::uint64_t min, std::uint64_t max);
  // A number, whole or not, in [min, max].
  std::optional<double> number(const nlohmann::json& value, const std::string& path, double min,
                               double max);
  // Bytes as an integer or a string such as "256M"; must be > 0.
  std::optional<std::uint64_t> size(const nlohmann::json& value, const std::string& path);
  // Milliseconds as an integer or a string such as "10s"; in [min, max].
  std::optional<std::chrono::milliseconds> duration(const nlohmann::json& value,
                                                    const std::string& path,
                                                    std::chrono::milliseconds min,
                                                    std::chrono::milliseconds max);

 private:
  void wrong_type(const nlohmann::json& value, const std::string& path, std::string_view expected);
  std::vector<Diagnostic> diagnostics_;
};

}  // namespace rlm::policy
