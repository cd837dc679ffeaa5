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
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm {

// A host-side tool the REPL's code may call by name (the RLM library's custom tools): without a
// value, a REPL global `name(*args, **kwargs)` whose calls the session's LlmHandler answers
// (LlmCall::kind == CallKind::tool, the arguments as JSON); with one, a global holding that JSON
// value. Restored after every cell, like the reserved names.
// How a tool's arguments, answer and value cross: `json` as plain JSON; `python` in the tagged
// JSON of python/rlm_sandbox/_pyvalues.py, which keeps tuples, sets, bytes, dict order and an
// exception's type (what the RLM library's LocalREPL callers see). The host passes either on
// as JSON; only the worker and the client that answers read the tags.
enum class ToolEncoding { json, python };
struct ToolSpec {
  std::string name;  // a Python identifier, not a keyword or one of the REPL's reserved names
  std::string description;
  std::optional<nlohmann::json> value;
  ToolEncoding encoding = ToolEncoding::json;
};
// The most tools a session takes, and the most bytes of all their names, descriptions and values
// (as JSON text) together: they cross in the hand-over frame.
inline constexpr std::size_t kMaxTools = 64;
inline constexpr std::size_t kMaxToolBytes = 1u << 20;
// Throws Error saying what is wrong with `tools`: a name that is no identifier, a keyword or
// reserved, twice the same name, too many, too large together.
void validate_tools(const std::vector<ToolSpec>& tools);
// [{"name", "description", "value"?, "encoding"?}...], as the hand-over, the server and `repl
// --tools` take them ("encoding": "json", the default, or "python"); tools_from_json() reads that
// (description optional) and validates. Throws Error.
nlohmann::json tools_to_json(const std::vector<ToolSpec>& tools);
std::vector<ToolSpec> tools_from_json(const nlohmann::json& document);

struct SessionOptions {
  std::string context;           // the REPL's `context` global: text, or JSON text when
  bool context_is_json = false;  // context_is_json (then `context` is the parsed value)
  std::string context_file;      // or read from this host file (any size; wins over `context`)
  // Answers llm_query, rlm_query and tool calls; null: every call fails with an error. The
  // session calls it through limit_llm_handler(llm, llm_limits).
  std::shared_ptr<LlmHandler> llm;
  LlmLimits llm_limits;
  bool echo_expression = true;  // print the repr of a cell's trailing expression
  std::vector<ToolSpec> tools;  // validate_tools() holds at the hand-over
  // The sandbox's whole lifetime. A cell's own limit is the policy's limits.wall_time_ms unless
  // execute() is given a tighter one; time spent waiting for llm_query answers does not count.
  std::chrono::milliseconds lifetime{std::chrono::hours(24)};
  std::chrono::milliseconds start_timeout{30'000};
  std::uint64_t max_frame_bytes = 16u << 20;  // a larger frame from the sandbox ends the session
  // Whose the files are that the session writes through read-write binds (Request::bind_owner);
  // unset: caller_ids(). A server sets its client's.
  std::optional<HostIds> bind_owner;
};

struct ExecuteOptions {
  std::optional<std::chrono::milliseconds> timeout;  // may only tighten the policy's wall time
  bool locals = false;               // CellResult::locals: the cells' variables after it ran
  std::optional<std::string> fetch;  // CellResult::fetched: this variable's value after it ran
};

// What add_context adds: `context_N` (and `context` for 0) or `history_N` (and `history`).
enum class ContextKind { context, history };
struct ContextInput {
  std::string data;  // text, or JSON text when is_json
  bool is_json = false;
  std::string file;  // or read from this host file (any size; wins over `data`)
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
  // answer["content"] (as str) when the cell set answer["ready"] (the RLM library's finish).
  std::optional<std::string> answer;
  // ExecuteOptions::locals: [{"name", "type", "repr", "value"?}...], at most 1,000; "value" is
  // the variable's JSON copy when it is small (at most 256 values and 4 KiB of text).
  std::optional<nlohmann::json> locals;
  // ExecuteOptions::fetch: {"value": V} (V as FINAL takes it) or {"error": "..."}.
  std::optional<nlohmann::json> fetched;
  std::optional<std::size_t> index;  // add_context: the N of the context_N or history_N set
  // save_to_fd: {"bytes": the save file's size, "skipped": [{"name", "type", "why"}...]} (the
  // variables that could not be saved: open files, sockets, generators...; at most 1,000).
  std::optional<nlohmann::json> saved;
  // Under an egress allowlist: what this cell did on the network (network_since of the
  // session's account before and after it).
  std::optional<NetworkAccount> network;

  // {"status", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "error", "final",
  //  "has_final", "wall_ms", "cpu_ms", "llm_calls", "rolled_back"}, and "answer", "locals",
  //  "fetched", "index", "saved" when set.
  nlohmann::json to_json() const;
};

// The CellResult a to_json() printed. Throws Error for a document of another shape.
CellResult cell_result_from_json(const nlohmann::json& document);
std::optional<CellStatus> cell_status_from_string(std::string_view text);

using SnapshotId = std::uint64_t;

// The largest state a save file holds (the sandbox's memory limit bounds it first).
inline constexpr std::uint64_t kMaxSavedStateBytes = 4ull << 30;

class Session {
 public:
  virtual ~Session() = default;  // closes, if close() was not called
  virtual std::string_view backend() const = 0;
  // The server node that holds the session (its --node-id; docs/fleet.md); "" for one of this
  // process's.
  virtual std::string node() const { return {}; }
  // Runs one cell. `timeout` may only tighten the policy's wall time. Throws Error when the
  // session is already over, or for a timeout above the policy's.
  virtual CellResult execute(const std::string& code, const ExecuteOptions& options) = 0;
  CellResult execute(const std::string& code,
                     std::optional<std::chrono::milliseconds> timeout = {}) {
    ExecuteOptions options;
    options.timeout = timeout;
    return execute(code, options);
  }
  // Adds a context (or a history entry) to the live session, handled like a cell (the policy's
  // wall time, a rollback when it fails hard): `index` null takes the next free N. The result's
  // `index` is the N set; status error (the state unchanged) for a JSON input that does not
  // parse. Throws Error when the session is over or the file cannot be opened.
  virtual CellResult add_context(ContextKind kind, const ContextInput& input,
                                 std::optional<std::size_t> index = {}) = 0;
  // A copy-on-write checkpoint of the interpreter as it is now, restorable any number of times.
  virtual SnapshotId snapshot() = 0;
  // Replaces the live interpreter with a fresh copy of the snapshot. Throws Error for an unknown
  // id.
  virtual void restore(SnapshotId id) = 0;
  // Save and restore (docs/sessions.md, "Save and restore"): save_to_fd writes the session's
  // state -- its variables (what cells defined by value, modules by name), contexts and
  // histories, the files under /tmp and the cwd -- to `fd` (a regular file, written from its
  // offset) as a save file, run like a cell; the result's `saved` lists what could not be kept.
  // load_from_fd replaces this session's state with the one a save file holds: the file is
  // checked first (framing, size, SHA-256, made by this worker under this policy), its content
  // is read only inside the sandbox. Status error with the reason for a state the sandbox cannot
  // read (another Python). Throw Error for a file that cannot be written, or one that fails the
  // checks, and when the session is over.
  virtual CellResult save_to_fd(int fd) = 0;
  virtual CellResult load_from_fd(int fd) = 0;
  // The same through a path: save() creates `path` (mode 0600; an existing file is replaced only
  // once the new one is complete), load() opens it read-only.
  CellResult save(const std::string& path);
  CellResult load(const std::string& path);
  // Narrows the session's egress allowlist while it runs (docs/network.md): from now on only
  // `entries` (policy allow entries, each within the list as it is; none: no network at all)
  // are let through. The sandbox's DNS answers and new connections follow the narrower list at
  // once, and its open connections that the list no longer lets through are ended. Deny entries,
  // "private" and limits stay. Throws PolicyError for a malformed entry, and Error when the
  // session is over, has no allowlist (a network of none has nothing to narrow; a sandbox on the
  // host's network cannot be put behind one while it runs), or an entry would widen the list.
  virtual void narrow_network(const std::vector<std::string>& entries) = 0;
  // Ends the session and everything in it (processes, cgroups, mounts); returns the sandbox's
  // Result. Idempotent.
  virtual Result close() = 0;
  // "" while the session is usable; else why it ended.
  virtual std::string ended() const = 0;
  // Callable from any thread, while another uses the session: ends its sandbox now (a server's
  // `kill`). A cell in progress ends as a session_error saying `why`, and so does every later
  // call; close() still returns the sandbox's Result. Only the first call's `why` is kept.
  virtual void kill(const std::string& why) = 0;
};

// fork(n) (docs/sessions.md, "Fork"): `count` new sessions holding the parent's state as it is
// now, each in a sandbox of its own (its own user, PID, mount, IPC and network namespaces, its
// own cgroup and limits, its own lifetime): the parent is saved once (save_to_fd, into a sealed
// memfd) and each branch, opened by `open_branch(i)` (a backend's open_session, a pool's, a
// server client's), loads it; branches are opened and loaded concurrently. The parent goes on
// unchanged. Modules are imported anew in each branch, so `random` and numpy's generator are
// seeded anew. Throws Error when the parent cannot be saved or a branch cannot be opened or
// loaded (every branch opened is closed then); `saved` is the parent's save result (what it
// could not keep).
struct Forked {
  CellResult saved;
  std::vector<std::unique_ptr<Session>> branches;
};
inline constexpr std::size_t kMaxForkBranches = 64;
using OpenBranch = std::function<std::unique_ptr<Session>(std::size_t index)>;
Forked fork_session(Session& parent, std::size_t count, const OpenBranch& open_branch);

}  // namespace rlm
