// validate_tools: the names a session's tools may take (SessionOptions::tools).
#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <string_view>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {
namespace {

using nlohmann::json;

// Python's keywords (3.8-3.13; soft keywords such as `match` are valid names).
constexpr std::array<std::string_view, 35> kKeywords = {
    "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
    "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
    "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
    "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};

// The REPL's own globals (docs/control-channel.md, "Reserved names").
constexpr std::array<std::string_view, 10> kReserved = {
    "context",   "history",           "answer", "llm_query", "llm_query_batched",
    "rlm_query", "rlm_query_batched", "FINAL",  "FINAL_VAR", "SHOW_VARS"};

bool identifier(std::string_view name) {
  const auto letter = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  if (name.empty() || !letter(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return letter(c) || (c >= '0' && c <= '9'); });
}

// context_0, history_12...: the numbered contexts and histories.
bool numbered(std::string_view name) {
  for (std::string_view stem : {"context_", "history_"}) {
    if (!name.starts_with(stem) || name.size() == stem.size()) continue;
    const auto digits = name.substr(stem.size());
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return true;
  }
  return false;
}

}  // namespace

void validate_tools(const std::vector<ToolSpec>& tools) {
  if (tools.size() > kMaxTools)
    throw Error("at most " + std::to_string(kMaxTools) + " tools, not " +
                std::to_string(tools.size()));
  std::set<std::string_view> seen;
  std::size_t bytes = 0;
  for (const auto& tool : tools) {
    const std::string_view name = tool.name;
    const std::string shown =
        "'" + std::string(name.substr(0, 64)) + (name.size() > 64 ? "...'" : "'");
    if (name.size() > 64 || !identifier(name))
      throw Error("tool name " + shown +
                  " is not an identifier (ASCII letters, digits and _, at most 64)");
    if (std::find(kKeywords.begin(), kKeywords.end(), name) != kKeywords.end())
      throw Error("tool name " + shown + " is a Python keyword");
    if (std::find(kReserved.begin(), kReserved.end(), name) != kReserved.end() || numbered(name) ||
        name.starts_with("__"))
      throw Error("tool name " + shown + " is one of the REPL's reserved names");
    if (!seen.insert(name).second) throw Error("tool name " + shown + " is given twice");
    bytes += name.size() + tool.description.size();
    if (tool.value)
      bytes += tool.value->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
    if (bytes > kMaxToolBytes)
      throw Error("the tools' names, descriptions and values take more than " +
                  std::to_string(kMaxToolBytes) + " bytes (as JSON)");
  }
}

json tools_to_json(const std::vector<ToolSpec>& tools) {
  json list = json::array();
  for (const auto& tool : tools) {
    json spec = {{"name", tool.name}, {"description", tool.description}};
    if (tool.value) spec["value"] = *tool.value;
    if (tool.encoding == ToolEncoding::python) spec["encoding"] = "python";
    list.push_back(std::move(spec));
  }
  return list;
}

std::vector<ToolSpec> tools_from_json(const json& document) {
  if (!document.is_array())
    throw Error(
        "the tools must be a JSON array of {\"name\", \"description\"?, \"value\"?, "
        "\"encoding\"?}");
  if (document.size() > kMaxTools)
    throw Error("at most " + std::to_string(kMaxTools) + " tools, not " +
                std::to_string(document.size()));
  std::vector<ToolSpec> tools;
  for (const auto& item : document) {
    if (!item.is_object()) throw Error("a tool must be an object {\"name\", ...}");
    ToolSpec tool;
    for (const auto& [key, value] : item.items()) {
      if (key == "name") {
        if (!value.is_string()) throw Error("a tool's \"name\" must be a string");
        tool.name = value.get<std::string>();
      } else if (key == "description") {
        if (!value.is_string() && !value.is_null())
          throw Error("a tool's \"description\" must be a string");
        if (value.is_string()) tool.description = value.get<std::string>();
      } else if (key == "value") {
        tool.value = value;
      } else if (key == "encoding") {
        if (value == "python")
          tool.encoding = ToolEncoding::python;
        else if (value != "json")
          throw Error("a tool's \"encoding\" is \"json\" or \"python\"");
      } else {
        throw Error("a tool takes only \"name\", \"description\", \"value\" and \"encoding\"");
      }
    }
    if (tool.name.empty()) throw Error("a tool needs \"name\": a string");
    tools.push_back(std::move(tool));
  }
  validate_tools(tools);
  return tools;
}

}  // namespace rlm
