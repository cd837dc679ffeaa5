// Policy text to a JSON document, with errors people can act on: the line and column of a syntax
// error, and every key given twice in one object (JSON parsers silently keep the last one, which
// hides mistakes such as a second "network" entry further down the file).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"

namespace rlm::policy {

struct ParsedText {
  std::optional<nlohmann::json> document;  // absent when the text is not JSON at all
  std::vector<Diagnostic> diagnostics;     // syntax error, or duplicate keys (document kept)
};

ParsedText parse_json_text(std::string_view text);

// JSON paths as diagnostics spell them: "limits" + "pids" -> "limits.pids"; "mounts" + 2 ->
// "mounts[2]". Keys that are not plain identifiers are quoted: env.set["MY VAR"].
std::string key_path(std::string_view parent, std::string_view key);
std::string index_path(std::string_view parent, std::size_t index);

}  // namespace rlm::policy
