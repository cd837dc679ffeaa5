// The built-in LM handlers behind make_llm_handler (rlm_sandbox/llm.hpp). Each answers on the
// calling thread; limit_llm_handler is what makes calls concurrent.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/llm.hpp"

namespace rlm::broker {

// How long one command or HTTP call may run before it is stopped (the command's process group
// killed, the request aborted), whatever the limiter's call timeout: the bound on how long a
// call the limiter has already given up on keeps a thread and a process.
inline constexpr std::chrono::milliseconds kMaxCallDuration = std::chrono::minutes(10);

// The largest answer taken from a command's stdout or an HTTP response, well under the control
// channel's 16 MiB frame once JSON-escaped.
inline constexpr std::size_t kMaxAnswerBytes = 8 << 20;

// What the handlers that do their work on the calling thread (command:, http:) share: a call
// cancelled before it starts is answered with cancelled_answer() without being run, and an
// exception from run() is the answer's error, worded by failure().
class CallingThreadHandler : public LlmHandler {
 public:
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) final;

 protected:
  virtual LlmAnswer run(const LlmCall& call) const = 0;
  virtual std::string failure(const std::exception& error) const = 0;
};

std::shared_ptr<LlmHandler> make_echo_handler();

// `max_duration` is kMaxCallDuration except in tests.
std::shared_ptr<LlmHandler> make_command_handler(
    std::string command, std::chrono::milliseconds max_duration = kMaxCallDuration);

// Reads the API key and default model from the environment now. Throws Error for a URL that is
// not http(s)://, NeedsFullBinary when this build has no HTTP client.
std::shared_ptr<LlmHandler> make_http_handler(std::string url);

// The answer to a call cancelled before a handler started it (LlmCall::cancelled).
LlmAnswer cancelled_answer();

// The call's prompt as a JSON value: its text as a string, or its JSON (prompt_is_json) parsed
// (made by the session from a bounded frame: at most 64 levels deep).
nlohmann::json prompt_value(const LlmCall& call);

// `text` with every invalid UTF-8 sequence replaced by U+FFFD: answers travel as JSON strings.
std::string valid_utf8(const std::string& text);

}  // namespace rlm::broker
