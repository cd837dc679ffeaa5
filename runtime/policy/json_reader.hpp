// Typed reads from a JSON document that never stop at the first problem: each failed read records
// a Diagnostic at its JSON path and returns nullopt, and the caller carries on with the rest. Below
// the reader, the combinators the policy's section readers build from it: a member read when
// present, one of a set of choices with a did-you-mean, a list of strings without duplicates.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/did_you_mean.hpp"
#include "policy/json_text.hpp"
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

// ---- Combinators the policy's section readers share
// ----------------------------------------------

// object[key], or nullptr when it has no such member.
const nlohmann::json* member(const nlohmann::json& object, std::string_view key);

// Calls read(value, path) for object[key] when present, and stores what it returns.
template <typename Read, typename Target>
void read_member(const nlohmann::json& object, const std::string& path, std::string_view key,
                 Read read, Target& target) {
  if (const nlohmann::json* value = member(object, key))
    if (auto result = read(*value, key_path(path, key))) target = static_cast<Target>(*result);
}

// `text` as a JSON string literal, for messages.
std::string as_json_string(std::string_view text);

// `text` when it is one of `choices`; otherwise reports it with a did-you-mean.
template <typename Choices>
std::optional<std::string> check_choice(JsonReader& reader, const std::string& text,
                                        const std::string& path, const Choices& choices) {
  if (std::find(std::begin(choices), std::end(choices), text) != std::end(choices)) return text;
  std::string message = "unknown value " + as_json_string(text);
  if (auto suggestion = closest_match(text, choices)) {
    message += "; did you mean " + *suggestion + "?";
  } else {
    message += "; expected one of:";
    for (const auto& choice : choices) message += " " + std::string(choice);
  }
  reader.error(path, message);
  return std::nullopt;
}

template <typename Choices>
std::optional<std::string> read_choice(JsonReader& reader, const nlohmann::json& value,
                                       const std::string& path, const Choices& choices) {
  auto text = reader.string(value, path);
  if (!text) return std::nullopt;
  return check_choice(reader, *text, path, choices);
}

// An array of strings each checked by `check` (which reports and returns nullopt on a problem,
// or returns the value to store), with duplicates of the stored form reported.
template <typename Check>
std::optional<std::vector<std::string>> read_string_list(JsonReader& reader,
                                                         const nlohmann::json& value,
                                                         const std::string& path, Check check) {
  if (!reader.array(value, path)) return std::nullopt;
  std::vector<std::string> items;
  std::map<std::string, std::size_t> first_index;
  bool valid = true;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const auto item_path = index_path(path, i);
    auto text = reader.string(value[i], item_path);
    std::optional<std::string> item = text ? check(*text, item_path) : std::nullopt;
    if (!item) {
      valid = false;
      continue;
    }
    if (auto [seen, inserted] = first_index.emplace(*item, i); !inserted) {
      reader.error(item_path, "duplicates " + index_path(path, seen->second) + " (" + *item + ")");
      valid = false;
      continue;
    }
    items.push_back(std::move(*item));
  }
  if (!valid) return std::nullopt;
  return items;
}

}  // namespace rlm::policy
