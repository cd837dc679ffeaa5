// parse_repl_request and LineSplitter: the orchestrator's lines, bounded and checked.
#include "repl/request.hpp"

#include <algorithm>

namespace rlm::repl {
namespace {

using nlohmann::json;

// At most `max` bytes of `text` in quotes, with "..." when cut: what a message may show of a
// string from the line.
std::string excerpt(std::string_view text, std::size_t max = 40) {
  std::string shown(text.substr(0, max));
  if (text.size() > max) shown += "...";
  return "'" + shown + "'";
}

enum class Shape { fits, too_deep, too_many_values };

// Whether the arrays and objects of `line` nest at most `max_depth` deep, and it holds at most
// `max_values` values (counted as its brackets and commas), judged on the bytes before any
// parser sees them: the parser itself does not recurse, but copying, comparing and printing a
// value do, and a value costs the host tens of bytes. Brackets and commas inside strings do not
// count. For valid JSON the count is exact; whatever this misjudges in invalid JSON the parser
// rejects.
Shape shape_of(std::string_view line, int max_depth, std::size_t max_values) {
  int depth = 0;
  std::size_t values = 0;
  bool in_string = false, escaped = false;
  for (const char c : line) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return Shape::too_deep;
      if (++values > max_values) return Shape::too_many_values;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',') {
      if (++values > max_values) return Shape::too_many_values;
    }
  }
  return Shape::fits;
}

// The id as it may be echoed: absent or null, a string of bounded length, or an integer.
std::optional<std::string> id_problem(const json& line) {
  const auto id = line.find("id");
  if (id == line.end() || id->is_null() || id->is_number_integer()) return std::nullopt;
  if (id->is_string()) {
    if (id->get_ref<const std::string&>().size() <= kMaxReplIdBytes) return std::nullopt;
    return "id: a string id may have at most " + std::to_string(kMaxReplIdBytes) + " bytes";
  }
  return "id must be a string, an integer or null";
}

std::optional<ReplOp> op_named(std::string_view name) {
  if (name == "execute") return ReplOp::execute;
  if (name == "llm_result") return ReplOp::llm_result;
  if (name == "snapshot") return ReplOp::snapshot;
  if (name == "restore") return ReplOp::restore;
  if (name == "close") return ReplOp::close;
  if (name == "context") return ReplOp::context;
  if (name == "add_context") return ReplOp::add_context;
  if (name == "add_history") return ReplOp::add_history;
  if (name == "narrow_network") return ReplOp::narrow_network;
  if (name == "save") return ReplOp::save;
  if (name == "load") return ReplOp::load;
  return std::nullopt;
}

// Whether `op` takes `key` ("op" and "id" go with every op).
bool op_takes(ReplOp op, std::string_view key) {
  if (key == "op" || key == "id") return true;
  switch (op) {
    case ReplOp::execute:
      return key == "code" || key == "timeout_ms" || key == "locals" || key == "fetch";
    case ReplOp::llm_result:
      return key == "query_id" || key == "text" || key == "error" || key == "value";
    case ReplOp::add_context:
      return key == "context" || key == "context_file" || key == "json" || key == "index";
    case ReplOp::add_history:
      return key == "history" || key == "history_file" || key == "index";
    case ReplOp::restore:
      return key == "snapshot";
    case ReplOp::narrow_network:
      return key == "allow";
    case ReplOp::save:
    case ReplOp::load:
      return key == "path";
    case ReplOp::context:
      return key == "context";
    case ReplOp::snapshot:
    case ReplOp::close:
      break;
  }
  return false;
}

// Thrown inside parse_repl_request only, and caught there.
struct Refusal {
  std::string message;
};

const json* field(const json& line, const char* key) {
  const auto found = line.find(key);
  return found == line.end() ? nullptr : &*found;
}

std::uint64_t unsigned_field(const json& line, const char* key, const std::string& what) {
  const json* value = field(line, key);
  if (!value || !value->is_number_unsigned()) throw Refusal{what};
  return value->get<std::uint64_t>();
}

std::optional<std::string> string_field(const json& line, const char* key,
                                        const std::string& what) {
  const json* value = field(line, key);
  if (!value) return std::nullopt;
  if (!value->is_string()) throw Refusal{what};
  return value->get<std::string>();
}

bool flag_field(const json& line, const char* key, const std::string& what) {
  const json* value = field(line, key);
  if (!value) return false;
  if (!value->is_boolean()) throw Refusal{what};
  return value->get<bool>();
}

std::optional<std::uint64_t> index_field(const json& line, const char* op) {
  if (!field(line, "index")) return std::nullopt;
  return unsigned_field(line, "index",
                        std::string(op) + ": \"index\" must be a non-negative integer");
}

std::chrono::milliseconds timeout_field(const json& value, std::chrono::milliseconds max) {
  const auto limit = static_cast<std::uint64_t>(std::max<std::int64_t>(max.count(), 0));
  if (value.is_number_unsigned()) {
    const auto ms = value.get<std::uint64_t>();
    if (ms >= 1 && ms <= limit) return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
    if (ms > limit)
      throw Refusal{"timeout_ms " + std::to_string(ms) + " is above the policy's " +
                    "limits.wall_time_ms of " + std::to_string(limit)};
  }
  throw Refusal{"timeout_ms must be an integer number of milliseconds from 1 to " +
                std::to_string(limit) + " (the policy's limits.wall_time_ms)"};
}

ReplRequest checked(const json& line, ReplOp op, std::string_view name,
                    const ReplInputLimits& limits) {
  for (auto item = line.begin(); item != line.end(); ++item) {
    const std::string& key = item.key();
    if (!op_takes(op, key))
      throw Refusal{"unknown key " + excerpt(key) + " for op " + std::string(name)};
  }
  ReplRequest request;
  request.op = op;
  switch (op) {
    case ReplOp::execute: {
      const json* code = field(line, "code");
      if (!code || !code->is_string()) throw Refusal{"execute needs \"code\": a string"};
      request.code = code->get<std::string>();
      if (const json* timeout = field(line, "timeout_ms"))
        request.timeout = timeout_field(*timeout, limits.max_timeout);
      request.locals = flag_field(line, "locals", "execute: \"locals\" must be a boolean");
      request.fetch = string_field(line, "fetch", "execute: \"fetch\" must be a string");
      if (request.fetch && (request.fetch->empty() || request.fetch->size() > kMaxReplFetchBytes))
        throw Refusal{"execute: \"fetch\" must be a variable name of 1 to " +
                      std::to_string(kMaxReplFetchBytes) + " bytes"};
      break;
    }
    case ReplOp::add_context: {
      const json* context = field(line, "context");
      const auto file = string_field(line, "context_file",
                                     "add_context: \"context_file\" must be a string (a path)");
      if (!context == !file)
        throw Refusal{
            "add_context needs exactly one of \"context\" (a string or any JSON) and "
            "\"context_file\" (a path)"};
      if (file && file->empty()) throw Refusal{"add_context: \"context_file\" is empty"};
      if (context) request.context = *context;  // within the depth bound: copying it is safe
      if (file) request.context_file = *file;
      request.context_json = flag_field(line, "json", "add_context: \"json\" must be a boolean");
      request.index = index_field(line, "add_context");
      break;
    }
    case ReplOp::add_history: {
      const json* history = field(line, "history");
      const auto file = string_field(line, "history_file",
                                     "add_history: \"history_file\" must be a string (a path)");
      if (!history == !file || (history && !history->is_array()))
        throw Refusal{
            "add_history needs exactly one of \"history\" (a list of messages) and "
            "\"history_file\" (a path to its JSON)"};
      if (file && file->empty()) throw Refusal{"add_history: \"history_file\" is empty"};
      if (history) request.context = *history;
      if (file) {  // JSON text parsed in the sandbox: its dicts keep their key order
        request.context_file = *file;
        request.context_json = true;
      }
      request.index = index_field(line, "add_history");
      break;
    }
    case ReplOp::llm_result:
      request.query_id = unsigned_field(line, "query_id",
                                        "llm_result needs \"query_id\": the integer from its "
                                        "llm_query event");
      request.text = string_field(line, "text", "llm_result: \"text\" must be a string");
      request.error = string_field(line, "error", "llm_result: \"error\" must be a string");
      if (const json* value = field(line, "value")) request.value = *value;
      if (request.text.has_value() + request.error.has_value() + request.value.has_value() != 1)
        throw Refusal{
            "llm_result needs exactly one of \"text\" and \"error\" (a string) and "
            "\"value\" (a tool's answer: any JSON)"};
      break;
    case ReplOp::narrow_network: {
      const json* allow = field(line, "allow");
      if (!allow || !allow->is_array())
        throw Refusal{"narrow_network needs \"allow\": a list of allow entries (strings)"};
      for (const auto& entry : *allow) {
        if (!entry.is_string())
          throw Refusal{"narrow_network: each allow entry is a string, like \"https://pypi.org\""};
        request.allow.push_back(entry.get<std::string>());
      }
      break;
    }
    case ReplOp::restore:
      request.snapshot = unsigned_field(line, "snapshot",
                                        "restore needs \"snapshot\": an id from a snapshot result");
      break;
    case ReplOp::save:
    case ReplOp::load: {
      const auto path =
          string_field(line, "path", std::string(name) + ": \"path\" must be a string");
      if (!path || path->empty())
        throw Refusal{std::string(name) + " needs \"path\": the save file" +
                      (op == ReplOp::save ? " to write" : " to read")};
      request.path = *path;
      break;
    }
    case ReplOp::context:
      if (!field(line, "context")) throw Refusal{"the context line needs \"context\""};
      request.context = line["context"];  // within the depth bound: copying it is safe
      break;
    case ReplOp::snapshot:
    case ReplOp::close:
      break;
  }
  return request;
}

}  // namespace

std::string overlong_line_message(std::size_t max_line_bytes) {
  return "the line is longer than " + std::to_string(max_line_bytes) +
         " bytes and was dropped (a large context goes in a file: --context FILE)";
}

bool blank_line(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

std::string json_shape_problem(std::string_view text, const ReplInputLimits& limits) {
  switch (shape_of(text, limits.max_depth, limits.max_values)) {
    case Shape::too_deep:
      return "it nests arrays and objects more than " + std::to_string(limits.max_depth) + " deep";
    case Shape::too_many_values:
      return "it holds more than " + std::to_string(limits.max_values) + " JSON values";
    case Shape::fits:
      break;
  }
  return "";
}

ParsedReplRequest parse_repl_request(std::string_view line, const ReplInputLimits& limits) {
  if (line.size() > limits.max_line_bytes)
    return ReplRequestError{json(), overlong_line_message(limits.max_line_bytes)};
  switch (shape_of(line, limits.max_depth, limits.max_values)) {
    case Shape::too_deep:
      return ReplRequestError{json(), "the line nests arrays and objects more than " +
                                          std::to_string(limits.max_depth) + " deep"};
    case Shape::too_many_values:
      return ReplRequestError{json(), "the line holds more than " +
                                          std::to_string(limits.max_values) +
                                          " JSON values (a large context goes in a file: "
                                          "--context FILE --context-json)"};
    case Shape::fits:
      break;
  }
  json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    return ReplRequestError{json(), "not a JSON object: " + std::string(line.substr(0, 80)) +
                                        (line.size() > 80 ? "..." : "")};
  if (auto problem = id_problem(parsed)) return ReplRequestError{json(), *problem};
  const json* id = field(parsed, "id");
  json usable_id = id ? *id : json();  // a scalar: copying it is safe

  const json* op_value = field(parsed, "op");
  if (!op_value) return ReplRequestError{usable_id, "a request needs an \"op\""};
  if (!op_value->is_string())
    return ReplRequestError{usable_id,
                            "\"op\" must be a string: execute, llm_result, add_context, "
                            "add_history, snapshot, restore, save, load, narrow_network, close "
                            "(or context, first)"};
  const auto& name = op_value->get_ref<const std::string&>();
  const auto op = op_named(name);
  if (!op)
    return ReplRequestError{usable_id,
                            "unknown op " + excerpt(name) +
                                "; expected execute, llm_result, add_context, "
                                "add_history, snapshot, restore, save, load, narrow_network "
                                "or close"};
  try {
    auto request = checked(parsed, *op, name, limits);
    request.id = std::move(usable_id);
    return request;
  } catch (const Refusal& refusal) {
    return ReplRequestError{usable_id, refusal.message};
  } catch (const std::exception& error) {  // a bug here must not end the repl
    return ReplRequestError{usable_id,
                            std::string("the request could not be read: ") + error.what()};
  }
}

void LineSplitter::feed(std::string_view bytes, const OnLine& on_line) {
  while (!bytes.empty()) {
    const auto newline = bytes.find('\n');
    const auto piece = bytes.substr(0, newline);
    if (!dropping_ && partial_.size() + piece.size() > max_) {
      dropping_ = true;
      partial_.clear();
      partial_.shrink_to_fit();
    }
    if (!dropping_) partial_.append(piece);
    if (newline == std::string_view::npos) return;
    bytes.remove_prefix(newline + 1);
    if (dropping_)
      on_line({}, true);
    else
      on_line(partial_, false);
    partial_.clear();
    dropping_ = false;
  }
}

void LineSplitter::finish(const OnLine& on_line) {
  if (dropping_)
    on_line({}, true);
  else if (!partial_.empty())
    on_line(partial_, false);
  partial_.clear();
  dropping_ = false;
}

}  // namespace rlm::repl
