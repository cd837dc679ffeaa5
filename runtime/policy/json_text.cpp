#include "policy/json_text.hpp"

#include <cctype>
#include <set>
#include <string>

namespace rlm::policy {
namespace {

using nlohmann::json;

// Far deeper than any policy; the limit keeps recursive copies and merges of a hostile document
// from exhausting the stack.
constexpr int kMaxDepth = 64;
struct TooDeep {};

// Where a container sits in the document, and what has been seen in it so far.
struct Frame {
  bool is_array = false;
  std::string path;
  std::set<std::string> keys;
  std::string last_key;
  std::size_t next_index = 0;
};

// Path of the value about to start inside `parent` (a key was just read, or an array element).
std::string child_path(Frame& parent) {
  if (parent.is_array) return index_path(parent.path, parent.next_index++);
  return key_path(parent.path, parent.last_key);
}

// 1-based line and column (in characters, not bytes) of the byte at `offset`.
std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {  // skip UTF-8 continuations
      ++column;
    }
  }
  return {line, column};
}

// The names nlohmann gives tokens in "expected ..." (lexer::token_type_name): fixed text.
constexpr std::string_view kTokenNames[] = {"<uninitialized>",
                                            "true literal",
                                            "false literal",
                                            "null literal",
                                            "string literal",
                                            "number literal",
                                            "'['",
                                            "'{'",
                                            "']'",
                                            "'}'",
                                            "':'",
                                            "','",
                                            "<parse error>",
                                            "end of input",
                                            "'[', '{', or a literal",
                                            "unknown token"};

// nlohmann quotes the bytes it read ("invalid literal; last read: 'root:x:0'", "number overflow
// parsing '1e400'"). The file may be anything (a policy can name another file), so its bytes never
// reach a message: the line and column say where, the reason says what.
std::string without_content(std::string message) {
  const std::string original = message;
  if (auto quoted = message.find("; last read: '"); quoted != std::string::npos) {
    message.erase(quoted);
    // The bytes read may themselves look like "; expected ...", so only a fixed token name
    // counts.
    for (auto name : kTokenNames) {
      const std::string expected = "; expected " + std::string(name);
      if (original.ends_with(expected)) {
        message += expected;
        break;
      }
    }
  }
  if (auto quoted = message.find(" parsing '"); quoted != std::string::npos) message.erase(quoted);
  return message;
}

// nlohmann's message without its exception id, position and parser-state prefix, and without
// the bytes it read: "unexpected '}'; expected string literal".
std::string readable_reason(std::string message) {
  message = without_content(std::move(message));
  if (auto id_end = message.find("] ");
      message.starts_with("[json.exception.") && id_end != std::string::npos)
    message.erase(0, id_end + 2);
  if (auto column = message.find(", column ");
      message.starts_with("parse error") && column != std::string::npos) {
    if (auto colon = message.find(": ", column); colon != std::string::npos)
      message.erase(0, colon + 2);
  }
  if (message.starts_with("syntax error while parsing ")) {
    if (auto dash = message.find(" - "); dash != std::string::npos) message.erase(0, dash + 3);
  }
  return message;
}

bool is_identifier(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

std::string key_path(std::string_view parent, std::string_view key) {
  if (!is_identifier(key)) return std::string(parent) + "[" + json(std::string(key)).dump() + "]";
  if (parent.empty()) return std::string(key);
  return std::string(parent) + "." + std::string(key);
}

std::string index_path(std::string_view parent, std::size_t index) {
  return std::string(parent) + "[" + std::to_string(index) + "]";
}

ParsedText parse_json_text(std::string_view text) {
  ParsedText result;
  std::vector<Frame> stack;
  const json::parser_callback_t track_keys = [&](int depth, json::parse_event_t event,
                                                 json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        if (depth >= kMaxDepth) throw TooDeep{};
        Frame frame;
        frame.is_array = event == json::parse_event_t::array_start;
        if (!stack.empty()) frame.path = child_path(stack.back());
        stack.push_back(std::move(frame));
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& object = stack.back();
        object.last_key = parsed.get<std::string>();
        if (!object.keys.insert(object.last_key).second)
          result.diagnostics.push_back(
              {key_path(object.path, object.last_key),
               "duplicate key; only the last value would count, so remove the others"});
        break;
      }
      case json::parse_event_t::value:
        if (!stack.empty() && stack.back().is_array) ++stack.back().next_index;
        break;
    }
    return true;
  };
  try {
    result.document = json::parse(text.begin(), text.end(), track_keys);
  } catch (const json::parse_error& error) {
    // error.byte is the 1-based offset of the last character read: the offending one.
    const auto [line, column] = line_and_column(text, error.byte == 0 ? 0 : error.byte - 1);
    result.diagnostics = {{"", "malformed JSON at line " + std::to_string(line) + ", column " +
                                   std::to_string(column) + ": " + readable_reason(error.what())}};
    result.document.reset();
  } catch (const TooDeep&) {
    result.diagnostics = {
        {"", "malformed JSON: nested more than " + std::to_string(kMaxDepth) + " levels deep"}};
    result.document.reset();
  } catch (const json::exception& error) {  // e.g. a number too large for a double
    result.diagnostics = {{"", "malformed JSON: " + readable_reason(error.what())}};
    result.document.reset();
  }
  return result;
}

}  // namespace rlm::policy
