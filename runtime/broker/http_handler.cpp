// The http: LM handler: an OpenAI-compatible chat completions endpoint.
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "broker/handlers.hpp"
#include "http/http_client.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::broker {
namespace {

using nlohmann::json;

constexpr std::string_view kDefaultModel = "gpt-4o-mini";
constexpr std::size_t kExcerptBytes = 300;  // of a body that is not what we expected

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// The value at `path`, or null when the document has no such thing.
json at(const json& document, const char* path) {
  const json::json_pointer pointer(path);
  return document.is_structured() && document.contains(pointer) ? document.at(pointer) : json();
}

std::string excerpt(const std::string& body) {
  return valid_utf8(body.size() > kExcerptBytes ? body.substr(0, kExcerptBytes) + "..." : body);
}

class HttpHandler final : public CallingThreadHandler {
 public:
  explicit HttpHandler(std::string url)
      : url_(std::move(url)),
        api_key_(environment("RLM_SANDBOX_LM_API_KEY")),
        default_model_(environment("RLM_SANDBOX_LM_MODEL")) {
    if (api_key_.empty()) api_key_ = environment("OPENAI_API_KEY");
    if (default_model_.empty()) default_model_ = kDefaultModel;
  }

 private:
  std::string failure(const std::exception& error) const override {
    return "LM endpoint " + url_ + ": " + error.what();
  }

  LlmAnswer run(const LlmCall& call) const override {
    if (call.kind == CallKind::tool)
      return LlmAnswer::of_error("the http: LM handler does not answer tool calls");
    // A message list is sent as the messages; rlm_query is asked like llm_query.
    const json messages = call.prompt_is_json
                              ? prompt_value(call)
                              : json::array({{{"role", "user"}, {"content", call.prompt}}});
    const json body = {{"model", call.model.value_or(default_model_)}, {"messages", messages}};
    http::Request request;
    request.method = "POST";
    request.url = url_;
    request.headers = {"Content-Type: application/json", "Accept: application/json"};
    if (!api_key_.empty()) request.headers.push_back("Authorization: Bearer " + api_key_);
    request.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    request.timeout = kMaxCallDuration;
    std::string received;
    request.on_body = [&received](std::string_view chunk) {
      received.append(chunk);
      return received.size() <= kMaxAnswerBytes;
    };

    const http::Response response = http::perform(request);
    if (!response.error.empty())
      return LlmAnswer::of_error("LM endpoint " + url_ + ": " + response.error);
    if (response.aborted)
      return LlmAnswer::of_error("the LM endpoint's answer exceeds " +
                                 std::to_string(kMaxAnswerBytes >> 20) + " MiB");
    const json document = json::parse(received, nullptr, false);
    if (response.status < 200 || response.status > 299) {
      const json api_message = at(document, "/error/message");
      return LlmAnswer::of_error(
          "LM endpoint " + url_ + " answered HTTP " + std::to_string(response.status) + ": " +
          (api_message.is_string() ? api_message.get<std::string>() : excerpt(received)));
    }
    const json content = at(document, "/choices/0/message/content");
    if (!content.is_string())
      return LlmAnswer::of_error(
          "LM endpoint " + url_ +
          " answered without choices[0].message.content: " + excerpt(received));
    return LlmAnswer::of_text(content.get<std::string>());
  }

  const std::string url_;
  std::string api_key_;  // never in a message: errors quote the URL and the response only
  std::string default_model_;
};

}  // namespace

std::shared_ptr<LlmHandler> make_http_handler(std::string url) {
  if (!url.starts_with("http://") && !url.starts_with("https://"))
    throw Error("http: LM handler: the URL must start with http:// or https:// (got '" + url +
                "')");
  // Here rather than at the first call, so the static CLI re-executes its full sibling before
  // the session starts.
  if (!http::available())
    throw NeedsFullBinary(
        "the http: LM handler needs the HTTP client, which this statically "
        "linked rlm-sandbox leaves out; run the dynamically linked one");
  return std::make_shared<HttpHandler>(std::move(url));
}

}  // namespace rlm::broker
