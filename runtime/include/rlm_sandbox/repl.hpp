// The repl engine: a persistent session driven by JSON lines, one request a line in, one event
// or answer a line out (docs/sessions.md, "The repl"). `rlm-sandbox repl` is this over its
// stdin and stdout; the Python client speaks it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/session.hpp"

namespace rlm {

struct ReplOptions {
  // The session's options. Without `llm` the orchestrator answers the cells' calls: each one
  // becomes an llm_query line out, answered by an llm_result line in. Without `context_file`
  // the first line in may carry the context, so the session opens once that line is read.
  SessionOptions session;
  // Opens the session (on a backend, or through a server); may throw Error.
  std::function<std::unique_ptr<Session>(SessionOptions)> open_session;
  std::string policy_name;                   // named in the ready line
  std::chrono::milliseconds max_timeout{0};  // the largest timeout_ms: the policy's wall time
  // A side channel for bulk prompts: when set, a text prompt over kReplBulkPromptBytes is written
  // to a new file in this directory (mode 0600, never replacing one) and its llm_query event
  // carries "prompt_file" (the path) and "prompt_bytes" instead of "prompt"; the orchestrator
  // reads it and removes it. A file that cannot be made leaves the prompt in the line.
  std::string bulk_dir;
};
inline constexpr std::size_t kReplBulkPromptBytes = 64 * 1024;

// Serves the protocol on `in_fd` and `out_fd` until close is done or `in_fd` ends, then closes
// the session and returns; reads nothing of `in_fd` after that. Throws Error, having written
// nothing, when the session could not be opened or `out_fd` is not open; a closed `in_fd` is an
// input that has ended. Writes never raise SIGPIPE: an orchestrator that stops reading only stops
// getting lines. The fds stay open (the caller's).
void serve_repl(ReplOptions options, int in_fd, int out_fd);

// `tools` as the repl's --tools flag takes them: JSON text of [{"name", "description",
// "value"?}...] within the bounds of a repl line, read by tools_from_json(). Throws Error.
std::vector<ToolSpec> repl_tools_from_text(std::string_view text);

}  // namespace rlm
