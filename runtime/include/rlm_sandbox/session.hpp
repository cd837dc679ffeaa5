// A long-lived sandbox hosting a persistent Python REPL (the RLM pattern): cells run one after
// another in the same interpreter state; `llm_query` calls from the sandbox are answered on the
// host by an LlmHandler; a cell that times out, hits the memory limit or kills the interpreter is
// rolled back to the state before it instead of losing the session. docs/sessions.md,
// docs/control-channel.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm {

struct SessionOptions {
  std::string context;              // the REPL's `context` global: text, or JSON text when
  bool context_is_json = false;     // context_is_json (then `context` is the parsed value)
  std::string context_file;         // or read from this host file (any size; wins over `context`)
  std::shared_ptr<LlmHandler> llm;  // answers llm_query; null: every call fails with an error
  // The sandbox's whole lifetime. A cell's own limit is the policy's limits.wall_time_ms unless
  // execute() is given a tighter one; time spent waiting for llm_query answers does not count.
  std::chrono::milliseconds lifetime{std::chrono::hours(24)};
  std::chrono::milliseconds start_timeout{30'000};
  std::uint64_t max_frame_bytes = 16u << 20;  // a larger frame from the sandbox ends the session
};

enum class CellStatus {
  ok,             // the cell ran to its end
  error,          // it raised a Python exception (the traceback is in `error`)
  timeout,        // it ran out of time; rolled back
  memory_limit,   // the kernel killed it at the memory limit; rolled back
  crashed,        // the interpreter died (a signal, os._exit); rolled back
  session_error,  // the session is over (the sandbox broke the protocol or ended)
};
std::string_view to_string(CellStatus status);

struct CellResult {
  CellStatus status = CellStatus::session_error;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  std::string error;                    // the traceback, or what happened, in words
  std::optional<nlohmann::json> final;  // set by FINAL(value) / FINAL_VAR(name)
  std::chrono::microseconds wall{0}, cpu{0};
  unsigned llm_calls = 0;
  bool rolled_back = false;  // the state is the one from before this cell

  // {"status", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "error", "final",
  //  "wall_ms", "cpu_ms", "llm_calls", "rolled_back"}
  nlohmann::json to_json() const;
};

// The CellResult a to_json() printed. Throws Error for a document of another shape.
CellResult cell_result_from_json(const nlohmann::json& document);
std::optional<CellStatus> cell_status_from_string(std::string_view text);

using SnapshotId = std::uint64_t;

class Session {
 public:
  virtual ~Session() = default;  // closes, if close() was not called
  virtual std::string_view backend() const = 0;
  // Runs one cell. `timeout` may only tighten the policy's wall time. Throws Error when the
  // session is already over, or for a timeout above the policy's.
  virtual CellResult execute(const std::string& code,
                             std::optional<std::chrono::milliseconds> timeout = {}) = 0;
  // A copy-on-write checkpoint of the interpreter as it is now, restorable any number of times.
  virtual SnapshotId snapshot() = 0;
  // Replaces the live interpreter with a fresh copy of the snapshot. Throws Error for an unknown
  // id.
  virtual void restore(SnapshotId id) = 0;
  // Ends the session and everything in it (processes, cgroups, mounts); returns the sandbox's
  // Result. Idempotent.
  virtual Result close() = 0;
  // "" while the session is usable; else why it ended.
  virtual std::string ended() const = 0;
};

}  // namespace rlm
