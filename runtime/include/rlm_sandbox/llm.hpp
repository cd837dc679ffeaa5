// Answering the sandbox's llm_query, rlm_query and tool calls on the host. A handler never runs
// inside the sandbox and nothing it receives is evaluated: prompts are strings (a message list or a
// tool's arguments as JSON text), answers are strings.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace rlm {

// What a call is for: llm_query (a sub-model), rlm_query (a sub-RLM; the handler decides how to
// answer it) or a tool the session registered (SessionOptions::tools).
enum class CallKind { llm, rlm, tool };
std::string_view to_string(CallKind kind);

struct LlmCall {
  // The prompt's text; with prompt_is_json, the JSON text of a message list ([{"role": str,
  // "content": str}...]) or, for a tool, of {"args": [...], "kwargs": {...}}.
  std::string prompt;
  bool prompt_is_json = false;
  std::optional<std::string> model;  // as the sandboxed code asked; nullopt = the handler's default
  // Set once nobody waits for the answer any more (the cell that asked has ended): a handler
  // that has not started the call yet answers with an error instead of asking a model.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  CallKind kind = CallKind::llm;
  std::string tool;  // the tool's name, for kind == tool

  bool is_cancelled() const { return cancelled && cancelled->load(); }
};

// A tool's answer text is the JSON text of its return value (an answer that is not JSON is taken
// as an error).
struct LlmAnswer {
  std::optional<std::string> text;  // the answer, or
  std::string error;                // why there is none (set exactly when text is empty)

  static LlmAnswer of_text(std::string text) { return {std::move(text), {}}; }
  static LlmAnswer of_error(std::string error) { return {std::nullopt, std::move(error)}; }
};

// Answers calls: `done` is called exactly once, from any thread, possibly before answer() returns
// (and must not throw). Implementations must be thread-safe: calls arrive concurrently. answer()
// may block its caller -- the built-in command: and http: handlers do their work on the calling
// thread -- so a session calls them through limit_llm_handler, whose answer() never blocks.
class LlmHandler {
 public:
  virtual ~LlmHandler() = default;
  virtual void answer(LlmCall call, std::function<void(LlmAnswer)> done) = 0;
  // True for a handler whose answer() only hands the call on (an event to the orchestrator, a
  // frame to a client) and returns at once, the answer coming later through `done`. The limiter
  // then hands its calls on one at a time from one thread, in the order the sandbox made them
  // (a batch's in prompt order), instead of a thread per call.
  virtual bool hands_calls_on() const { return false; }
};

// The built-in handlers, by the `--lm` spelling of the CLI:
//   "echo"          answers "echo: <prompt>" (demos and tests); a tool call is answered with its
//                   own {"args","kwargs"} (its prompt)
//   "command:CMD"   runs `/bin/sh -c CMD` on the host per call, in its own process group, with
//                   {"prompt","model","kind"} as one JSON line on stdin (a message list or a
//                   tool's arguments as JSON, not text; "tool" for a tool call); its stdout is the
//                   answer (a JSON object {"text"} or {"error"} is unwrapped; anything else is
//                   taken as the text, less one trailing newline); a non-zero exit or a signal is
//                   an error carrying the end of its stderr. When the shell exits, everything it
//                   started is killed (a guard process, its subreaper, finds what left the group
//                   too); a call still running after 10 minutes is killed the same way, and so is
//                   every call when the host process dies; an answer over 8 MiB is an error
//   "http:URL"      an OpenAI-compatible chat completions endpoint (POST URL with
//                   {"model","messages":[{"role":"user","content":prompt}]} (or the call's own
//                   message list; rlm_query is asked like llm_query, a tool call is refused),
//                   the answer being
//                   choices[0].message.content; a non-2xx status is an error carrying the API's
//                   error.message); the API key comes from the host environment variable
//                   RLM_SANDBOX_LM_API_KEY (or OPENAI_API_KEY; no Authorization header when
//                   neither is set), read when the handler is made, and never enters the sandbox;
//                   the model defaults to RLM_SANDBOX_LM_MODEL, else gpt-4o-mini
// Throws Error for an unknown spelling, NeedsFullBinary for http: in the static CLI.
std::shared_ptr<LlmHandler> make_llm_handler(std::string_view spec);

// Wraps a handler with the session's rules: at most `concurrency` calls running at once (the rest
// queue), each answered with an error after `call_timeout` if the handler has not answered (a late
// answer is dropped), and at most `budget` calls per session (later ones are answered with an
// error at once, without reaching the handler).
// The timeout counts from the call's arrival, queueing included; a call answered by the timeout
// keeps its place under the concurrency cap until the handler does answer it. Each running call
// has a thread of its own, so answer() never blocks (a handler that hands_calls_on() gets its
// calls from one thread of the limiter's, in arrival order). Destroying the returned handler
// answers every unanswered call with an error at once and never waits for the inner handler; no
// thread outlives it except those still inside the inner handler's answer(). Throws Error for a
// null handler, a zero concurrency or a timeout that is not positive. A session wraps its handler
// itself, with SessionOptions::llm_limits. The defaults are set so that a real recursive run does
// not hit them.
struct LlmLimits {
  std::size_t concurrency = 16;
  std::chrono::milliseconds call_timeout{600'000};
  std::size_t budget = 100'000;
};
std::shared_ptr<LlmHandler> limit_llm_handler(std::shared_ptr<LlmHandler> inner, LlmLimits limits);

}  // namespace rlm
