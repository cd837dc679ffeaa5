// Answering the sandbox's llm_query calls on the host. A handler never runs inside the sandbox and
// nothing it receives is evaluated: prompts are strings, answers are strings.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace rlm {

struct LlmCall {
  std::string prompt;
  std::optional<std::string> model;  // as the sandboxed code asked; nullopt = the handler's default
};

struct LlmAnswer {
  std::optional<std::string> text;  // the answer, or
  std::string error;                // why there is none (set exactly when text is empty)

  static LlmAnswer of_text(std::string text) { return {std::move(text), {}}; }
  static LlmAnswer of_error(std::string error) { return {std::nullopt, std::move(error)}; }
};

// Answers calls asynchronously: `done` is called exactly once, from any thread, possibly before
// answer() returns. Implementations must be thread-safe: calls arrive concurrently.
class LlmHandler {
 public:
  virtual ~LlmHandler() = default;
  virtual void answer(LlmCall call, std::function<void(LlmAnswer)> done) = 0;
};

// The built-in handlers, by the `--lm` spelling of the CLI:
//   "echo"          answers "echo: <prompt>" (demos and tests)
//   "command:CMD"   runs `sh -c CMD` on the host per call with {"prompt","model"} as one JSON line
//                   on stdin; its stdout is the answer (a JSON object {"text"} or {"error"} is
//                   unwrapped; anything else is taken as the text); a non-zero exit is an error
//                   carrying its stderr
//   "http:URL"      an OpenAI-compatible chat completions endpoint (POST URL with
//                   {"model","messages":[{"role":"user","content":prompt}]}); the API key comes
//                   from the host environment variable RLM_SANDBOX_LM_API_KEY (or OPENAI_API_KEY)
//                   and never enters the sandbox; the model defaults to RLM_SANDBOX_LM_MODEL
// Throws Error for an unknown spelling.
std::shared_ptr<LlmHandler> make_llm_handler(std::string_view spec);

// Wraps a handler with the session's rules: at most `concurrency` calls running at once (the rest
// queue), each answered with an error after `call_timeout` if the handler has not answered (a late
// answer is dropped), and at most `budget` calls per session (later ones are answered with an
// error at once, without reaching the handler).
struct LlmLimits {
  std::size_t concurrency = 8;
  std::chrono::milliseconds call_timeout{120'000};
  std::size_t budget = 1000;
};
std::shared_ptr<LlmHandler> limit_llm_handler(std::shared_ptr<LlmHandler> inner, LlmLimits limits);

}  // namespace rlm
