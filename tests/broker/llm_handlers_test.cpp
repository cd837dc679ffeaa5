// The built-in LM handlers (make_llm_handler): echo, command: and http:.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "broker/handlers.hpp"
#include "http/echo_server.hpp"
#include "llm_test_util.hpp"
#include "rlm_sandbox/error.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

bool gone_within(pid_t pid, milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  while (process_alive(pid)) {
    if (steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

TEST(LlmSpec, EchoAnswersThePrompt) {
  const auto handler = make_llm_handler("echo");
  const LlmAnswer answer = ask(*handler, "hi");
  EXPECT_EQ(answer.text, "echo: hi");
  EXPECT_EQ(answer.error, "");
}

TEST(LlmSpec, UnknownSpellingsThrowError) {
  for (const char* spec : {"", "bogus", "Echo", "command:", "http:", "http:ftp://example.com",
                           "http:api.openai.com/v1/chat/completions"}) {
    try {
      make_llm_handler(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()), "") << spec;
    }
  }
}

TEST(LlmCommand, GetsTheCallAsOneJsonLineOnStdin) {
  const auto handler = make_llm_handler("command:cat");
  EXPECT_EQ(json::parse(*ask(*handler, "hi").text),
            (json{{"prompt", "hi"}, {"model", nullptr}, {"kind", "llm"}}));
  EXPECT_EQ(json::parse(*ask(*handler, "line\nbreak", "m1").text),
            (json{{"prompt", "line\nbreak"}, {"model", "m1"}, {"kind", "llm"}}));
  EXPECT_EQ(ask(*make_llm_handler("command:wc -l"), "a\nb").text, "1");
}

// Issue 13: a message list and a tool's arguments reach the command as JSON (not as the text of
// it), with the call's kind and the tool's name.
TEST(LlmCommand, MessageListsAndToolCallsReachItAsJson) {
  const auto handler = make_llm_handler("command:cat");
  LlmCall messages;
  messages.prompt = R"([{"role":"user","content":"hi"}])";
  messages.prompt_is_json = true;
  messages.kind = CallKind::rlm;
  EXPECT_EQ(json::parse(*ask(*handler, messages).text),
            json::parse(R"({"prompt": [{"role": "user", "content": "hi"}], "model": null,
                            "kind": "rlm"})"));
  LlmCall tool;
  tool.prompt = R"({"args":[1],"kwargs":{}})";
  tool.prompt_is_json = true;
  tool.kind = CallKind::tool;
  tool.tool = "lookup";
  EXPECT_EQ(json::parse(*ask(*handler, tool).text),
            json::parse(R"({"prompt": {"args": [1], "kwargs": {}}, "model": null,
                            "kind": "tool", "tool": "lookup"})"));
  EXPECT_EQ(ask(*make_llm_handler("echo"), tool).text, tool.prompt) << "echo answers a tool call "
                                                                       "with its arguments";
}

TEST(LlmCommand, PlainStdoutIsTheTextWithoutOneTrailingNewline) {
  EXPECT_EQ(ask(*make_llm_handler("command:echo hello world"), "p").text, "hello world");
  EXPECT_EQ(ask(*make_llm_handler("command:printf 'a\\n\\n'"), "p").text, "a\n");
  EXPECT_EQ(ask(*make_llm_handler("command:echo '{\"answer\": 42}'"), "p").text,
            "{\"answer\": 42}");
}

TEST(LlmCommand, JsonTextIsUnwrapped) {
  const auto answer = ask(*make_llm_handler("command:echo '{\"text\": \"unwrapped\"}'"), "p");
  EXPECT_EQ(answer.text, "unwrapped");
}

TEST(LlmCommand, JsonErrorIsAnError) {
  const auto answer = ask(*make_llm_handler("command:echo '{\"error\": \"no quota\"}'"), "p");
  EXPECT_EQ(answer.text, std::nullopt);
  EXPECT_EQ(answer.error, "no quota");
}

TEST(LlmCommand, NonZeroExitIsAnErrorCarryingStderr) {
  const auto answer =
      ask(*make_llm_handler("command:echo partial; echo 'model unavailable' >&2; exit 3"), "p");
  EXPECT_EQ(answer.text, std::nullopt);
  EXPECT_NE(answer.error.find("status 3"), std::string::npos) << answer.error;
  EXPECT_NE(answer.error.find("model unavailable"), std::string::npos) << answer.error;
}

TEST(LlmCommand, DeathBySignalIsAnError) {
  const auto answer = ask(*make_llm_handler("command:kill -TERM $$"), "p");
  EXPECT_NE(answer.error.find("signal 15"), std::string::npos) << answer.error;
}

TEST(LlmCommand, HugePromptToACommandThatNeverReadsIt) {
  const auto answer = ask(*make_llm_handler("command:echo ignored"), std::string(4 << 20, 'p'));
  EXPECT_EQ(answer.text, "ignored") << answer.error;
}

TEST(LlmCommand, LargeAnswerAndAnswerOverTheCap) {
  const auto large = ask(*make_llm_handler("command:head -c 3000000 /dev/zero | tr '\\0' a"), "p");
  ASSERT_TRUE(large.text) << large.error;
  EXPECT_EQ(large.text->size(), 3'000'000u);
  const auto too_large =
      ask(*make_llm_handler("command:head -c " + std::to_string(broker::kMaxAnswerBytes + 1) +
                            " /dev/zero | tr '\\0' a"),
          "p");
  EXPECT_NE(too_large.error.find("exceeds"), std::string::npos) << too_large.error;
}

TEST(LlmCommand, InvalidUtf8IsReplaced) {
  EXPECT_EQ(ask(*make_llm_handler("command:printf 'a\\377b'"), "p").text,
            "a\xEF\xBF\xBD"
            "b");
}

TEST(LlmCommand, BackgroundJobsAreKilledOnceTheShellExits) {
  // The background sleep holds stdout open; the answer must not wait for it.
  const auto start = steady_clock::now();
  const auto answer = ask(*make_llm_handler("command:sleep 1000 & echo $!"), "p");
  EXPECT_LT(steady_clock::now() - start, milliseconds(5'000));
  ASSERT_TRUE(answer.text) << answer.error;
  EXPECT_TRUE(gone_within(std::stoi(*answer.text), milliseconds(5'000)));
}

TEST(LlmCommand, ProcessesThatLeftTheGroupAreKilledOnceTheShellExits) {
  // setsid: a new session and process group, out of reach of a kill(-group).
  const auto answer = ask(*make_llm_handler("command:setsid sleep 1000 & echo $!"), "p");
  ASSERT_TRUE(answer.text) << answer.error;
  EXPECT_TRUE(gone_within(std::stoi(*answer.text), milliseconds(5'000)));
}

TEST(LlmCommand, CommandIsKilledAfterItsLongestDuration) {
  const auto handler =
      broker::make_command_handler("echo started >&2; sleep 1000", milliseconds(500));
  const auto start = steady_clock::now();
  const auto answer = ask(*handler, "p");
  const auto took = steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(500));
  EXPECT_LT(took, milliseconds(5'000));
  EXPECT_NE(answer.error.find("did not answer within 500 ms"), std::string::npos) << answer.error;
  EXPECT_NE(answer.error.find("started"), std::string::npos) << answer.error;
}

TEST(LlmCommand, HangingCommandUnderTheLimitTimeoutIsAnsweredAndLaterKilled) {
  TempDir directory;
  const std::string pids = directory.file("pids");
  const auto handler =
      limit_llm_handler(broker::make_command_handler("sleep 1000 & echo $$ $! > " + pids + "; wait",
                                                     milliseconds(1'500)),
                        {.concurrency = 2, .call_timeout = milliseconds(300), .budget = 10});
  const auto start = steady_clock::now();
  const auto answer = ask(*handler, "p");
  EXPECT_LT(steady_clock::now() - start, milliseconds(1'200));
  EXPECT_NE(answer.error.find("timed out"), std::string::npos) << answer.error;

  pid_t shell = 0, sleeper = 0;
  std::ifstream(pids) >> shell >> sleeper;
  ASSERT_GT(shell, 0);
  ASSERT_GT(sleeper, 0);
  EXPECT_TRUE(gone_within(shell, milliseconds(10'000)));
  EXPECT_TRUE(gone_within(sleeper, milliseconds(10'000)));
}

TEST(LlmCommand, CancelledCallRunsNothing) {
  TempDir directory;
  LlmCall call = call_of("p");
  call.cancelled = std::make_shared<std::atomic<bool>>(true);
  const auto answer = ask(*make_llm_handler("command:touch " + directory.file("ran")), call);
  EXPECT_NE(answer.error.find("cancelled"), std::string::npos) << answer.error;
  EXPECT_FALSE(std::filesystem::exists(directory.file("ran")));
  EXPECT_EQ(ask(*make_llm_handler("echo"), call).text, std::nullopt);
}

TEST(LlmCommand, ConcurrentCallsEachGetTheirOwnAnswer) {
  // Each call's stdin must reach EOF although other calls spawn meanwhile.
  const auto handler = limit_llm_handler(make_llm_handler("command:cat"),
                                         {.concurrency = 8, .call_timeout = milliseconds(30'000)});
  auto answers = std::make_shared<Answers>();
  constexpr std::size_t kCalls = 24;
  for (std::size_t i = 0; i < kCalls; ++i)
    handler->answer(call_of("prompt " + std::to_string(i)), answers->callback(i));
  ASSERT_TRUE(answers->wait_for(kCalls));
  for (std::size_t i = 0; i < kCalls; ++i) {
    const LlmAnswer answer = answers->at(i);
    ASSERT_TRUE(answer.text) << answer.error;
    EXPECT_EQ(json::parse(*answer.text)["prompt"], "prompt " + std::to_string(i));
  }
}

class LlmHttp : public WithEchoServer {
 protected:
  // What the test server received, which its chat completion answers with.
  static json received(const LlmAnswer& answer) {
    EXPECT_TRUE(answer.text) << answer.error;
    return answer.text ? json::parse(*answer.text) : json();
  }
};

TEST_F(LlmHttp, PostsAChatCompletionWithTheKeyFromTheEnvironment) {
  ScopedEnv key("RLM_SANDBOX_LM_API_KEY", "sk-test-key");
  ScopedEnv other_key("OPENAI_API_KEY", "sk-not-this-one");
  ScopedEnv model("RLM_SANDBOX_LM_MODEL", "test-model");
  const auto handler = make_llm_handler("http:" + server().url("/v1/chat/completions"));
  const json request = received(ask(*handler, "What is 2+2?"));
  EXPECT_EQ(request["method"], "POST");
  EXPECT_EQ(request["path"], "/v1/chat/completions");
  EXPECT_EQ(request["headers"]["authorization"], "Bearer sk-test-key");
  EXPECT_EQ(request["headers"]["content-type"], "application/json");
  EXPECT_EQ(json::parse(request["body"].get<std::string>()),
            (json{{"model", "test-model"},
                  {"messages", {{{"role", "user"}, {"content", "What is 2+2?"}}}}}));
}

TEST_F(LlmHttp, TheCallsModelOverridesTheDefault) {
  ScopedEnv model("RLM_SANDBOX_LM_MODEL", "test-model");
  const auto handler = make_llm_handler("http:" + server().url("/v1/chat/completions"));
  const json request = received(ask(*handler, "p", "gpt-4.1"));
  EXPECT_EQ(json::parse(request["body"].get<std::string>())["model"], "gpt-4.1");
}

TEST_F(LlmHttp, OpenAiKeyAndDefaultModelAreTheFallbacks) {
  ScopedEnv key("RLM_SANDBOX_LM_API_KEY", std::nullopt);
  ScopedEnv other_key("OPENAI_API_KEY", "sk-openai");
  ScopedEnv model("RLM_SANDBOX_LM_MODEL", std::nullopt);
  const auto handler = make_llm_handler("http:" + server().url("/v1/chat/completions"));
  const json request = received(ask(*handler, "p"));
  EXPECT_EQ(request["headers"]["authorization"], "Bearer sk-openai");
  EXPECT_EQ(json::parse(request["body"].get<std::string>())["model"], "gpt-4o-mini");
}

TEST_F(LlmHttp, NoKeyNoAuthorizationHeader) {
  ScopedEnv key("RLM_SANDBOX_LM_API_KEY", std::nullopt);
  ScopedEnv other_key("OPENAI_API_KEY", std::nullopt);
  const auto handler = make_llm_handler("http:" + server().url("/v1/chat/completions"));
  EXPECT_FALSE(received(ask(*handler, "p"))["headers"].contains("authorization"));
}

TEST_F(LlmHttp, ErrorStatusCarriesTheApisMessage) {
  ScopedEnv key("RLM_SANDBOX_LM_API_KEY", "sk-secret");
  const auto answer = ask(*make_llm_handler("http:" + server().url("/status/401")), "p");
  EXPECT_EQ(answer.text, std::nullopt);
  EXPECT_NE(answer.error.find("HTTP 401"), std::string::npos) << answer.error;
  EXPECT_NE(answer.error.find("the test server answers 401"), std::string::npos) << answer.error;
  EXPECT_EQ(answer.error.find("sk-secret"), std::string::npos) << answer.error;
}

TEST_F(LlmHttp, AnswerWithoutContentIsAnError) {
  const auto answer = ask(*make_llm_handler("http:" + server().url("/v1/no-choices")), "p");
  EXPECT_NE(answer.error.find("choices[0].message.content"), std::string::npos) << answer.error;
}

TEST_F(LlmHttp, UnreachableEndpointIsAnError) {
  // Nothing listens on port 1 of the loopback.
  const auto answer = ask(*make_llm_handler("http:http://127.0.0.1:1/v1/chat/completions"), "p");
  EXPECT_EQ(answer.text, std::nullopt);
  EXPECT_NE(answer.error.find("127.0.0.1:1"), std::string::npos) << answer.error;
}

}  // namespace
}  // namespace rlm::test
