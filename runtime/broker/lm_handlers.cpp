// make_llm_handler: the `--lm` spellings, the echo handler, and what the handlers share.
#include <nlohmann/json.hpp>

#include "broker/handlers.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm {
namespace broker {
namespace {

class EchoHandler final : public LlmHandler {
 public:
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    if (call.is_cancelled()) return done(cancelled_answer());
    // A tool's answer must be JSON: its own arguments.
    done(LlmAnswer::of_text(call.kind == CallKind::tool ? call.prompt : "echo: " + call.prompt));
  }
};

}  // namespace

void CallingThreadHandler::answer(LlmCall call, std::function<void(LlmAnswer)> done) {
  if (call.is_cancelled()) return done(cancelled_answer());
  LlmAnswer answer;
  try {
    answer = run(call);
  } catch (const std::exception& error) {
    answer = LlmAnswer::of_error(failure(error));
  }
  done(std::move(answer));
}

std::shared_ptr<LlmHandler> make_echo_handler() {
  return std::make_shared<EchoHandler>();
}

LlmAnswer cancelled_answer() {
  return LlmAnswer::of_error("the LM call was cancelled before it started");
}

nlohmann::json prompt_value(const LlmCall& call) {
  if (!call.prompt_is_json) return call.prompt;
  auto value = nlohmann::json::parse(call.prompt, nullptr, /*allow_exceptions=*/false);
  return value.is_discarded() ? nlohmann::json(call.prompt) : value;
}

std::string valid_utf8(const std::string& text) {
  using nlohmann::json;
  // The serializer's replacing error handler is the one UTF-8 validator at hand.
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

}  // namespace broker

std::string_view to_string(CallKind kind) {
  constexpr std::string_view kNames[] = {"llm", "rlm", "tool"};  // in CallKind's order
  const auto index = static_cast<std::size_t>(kind);
  return index < std::size(kNames) ? kNames[index] : kNames[0];
}

std::shared_ptr<LlmHandler> make_llm_handler(std::string_view spec) {
  constexpr std::string_view kCommand = "command:", kHttp = "http:";
  if (spec == "echo") return broker::make_echo_handler();
  if (spec.starts_with(kCommand) && spec.size() > kCommand.size())
    return broker::make_command_handler(std::string(spec.substr(kCommand.size())));
  // A URL on its own is the http: handler's (`--lm http://localhost:8000/v1/chat/completions`):
  // read as http:URL, it was "//localhost:8000/..." and refused.
  if (spec.starts_with("http://") || spec.starts_with("https://"))
    return broker::make_http_handler(std::string(spec));
  if (spec.starts_with(kHttp) && spec.size() > kHttp.size())
    return broker::make_http_handler(std::string(spec.substr(kHttp.size())));
  throw Error("unknown LM handler '" + std::string(spec) +
              "': expected echo, command:CMD (e.g. command:./ask-llm.sh), or an http(s) URL "
              "(e.g. https://api.openai.com/v1/chat/completions, also written http:URL)");
}

}  // namespace rlm
