// The repl's input: the orchestrator's JSON lines, cut into lines of bounded length and checked
// field by field before anything else looks at them (docs/sessions.md, "The repl's input"). Needs
// no session and no Boost: the unit tests and the fuzzer (tests/fuzz/repl_input_fuzz.cpp) drive it
// directly.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

namespace rlm::repl {

// The longest line taken: the session's largest control frame (SessionOptions::max_frame_bytes),
// which an execute's code has to fit in anyway. A longer line is dropped as it arrives.
inline constexpr std::size_t kMaxReplLineBytes = 16u << 20;
// The deepest nesting of arrays and objects in a line, the line's own object counting as 1.
inline constexpr int kMaxReplLineDepth = 64;
// The most values (counted as brackets and commas) in a line: what a parsed line may cost the
// host, a few tens of bytes a value, stays in tens of MiB.
inline constexpr std::size_t kMaxReplLineValues = 1u << 18;
// The longest string id: ids are echoed in every event of a request.
inline constexpr std::size_t kMaxReplIdBytes = 1024;

struct ReplInputLimits {
  std::size_t max_line_bytes = kMaxReplLineBytes;
  int max_depth = kMaxReplLineDepth;
  std::size_t max_values = kMaxReplLineValues;
  std::chrono::milliseconds max_timeout{0};  // the largest timeout_ms: the policy's wall time
};

enum class ReplOp {
  execute,
  llm_result,
  snapshot,
  restore,
  close,
  context,
  add_context,
  add_history,
  narrow_network,
  save,
  load
};

// The longest variable name `fetch` takes.
inline constexpr std::size_t kMaxReplFetchBytes = 1024;

// One checked request: every field the op uses has its type and range.
struct ReplRequest {
  ReplOp op = ReplOp::close;
  nlohmann::json id;                                 // null, a string or an integer
  std::string code;                                  // execute
  std::optional<std::chrono::milliseconds> timeout;  // execute: 1 ms to max_timeout
  bool locals = false;                               // execute
  std::optional<std::string> fetch;                  // execute: a name of at most 1024 bytes
  std::uint64_t query_id = 0;                        // llm_result
  std::optional<std::string> text, error;            // llm_result: exactly one of these and
  std::optional<nlohmann::json> value;               // value (a tool's answer) is set
  std::uint64_t snapshot = 0;                        // restore
  // context, add_context: any value, depth-bounded (a string: text, unless context_json);
  // add_history: an array.
  nlohmann::json context;
  std::string context_file;            // add_context: instead of `context`
  bool context_json = false;           // add_context: "json"
  std::optional<std::uint64_t> index;  // add_context, add_history
  std::vector<std::string> allow;      // narrow_network: the allow entries, each a string
  std::string path;                    // save, load: the save file (not empty)
};

// Why a line is not a request, and the line's id when it had a usable one (else null).
struct ReplRequestError {
  nlohmann::json id;
  std::string message;
};

using ParsedReplRequest = std::variant<ReplRequest, ReplRequestError>;

// Never throws, never recurses on the line's nesting, never copies a value of the line into the
// message (at most a short, quoted prefix of a string).
ParsedReplRequest parse_repl_request(std::string_view line, const ReplInputLimits& limits);

// Why JSON text `text` is not within the line bounds of `limits` (nesting, number of values), or
// "" when it is; judged on the bytes, before any parser (the --tools flag).
std::string json_shape_problem(std::string_view text, const ReplInputLimits& limits);

// The message for a line longer than `max_line_bytes`.
std::string overlong_line_message(std::size_t max_line_bytes);

// Only spaces, tabs and carriage returns: skipped, not answered.
bool blank_line(std::string_view line);

// Cuts a byte stream into lines without their '\n'. A line longer than the bound is never held
// whole: its bytes are dropped as they arrive and it is reported once, when its '\n' (or the end)
// comes. So the buffer never exceeds the bound.
class LineSplitter {
 public:
  // `overlong` is true for a line over the bound (then `line` is empty).
  using OnLine = std::function<void(std::string_view line, bool overlong)>;

  explicit LineSplitter(std::size_t max_line_bytes) : max_(max_line_bytes) {}
  void feed(std::string_view bytes, const OnLine& on_line);
  // The end of the input: a last line without '\n' is reported.
  void finish(const OnLine& on_line);

 private:
  std::size_t max_;
  std::string partial_;
  bool dropping_ = false;  // inside a line already over the bound
};

}  // namespace rlm::repl
