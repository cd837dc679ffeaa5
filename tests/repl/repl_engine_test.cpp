// The repl engine (rlm_sandbox/repl.hpp) in process, without the CLI: serve_repl on a thread of
// the test, its input and output pipes held by the test, a session on the local backend.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/repl.hpp"

namespace rlm {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// An LM that answers every call with the same text, at once.
class FixedAnswer final : public LlmHandler {
 public:
  void answer(LlmCall, std::function<void(LlmAnswer)> done) override {
    done(LlmAnswer::of_text("fixed"));
  }
};

// serve_repl on its own thread; the test is the orchestrator at the other ends of the pipes.
class Repl {
 public:
  explicit Repl(ReplOptions options) {
    if (pipe2(to_repl_, O_CLOEXEC) != 0 || pipe2(from_repl_, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe2 failed");
    if (!options.open_session) {
      options.open_session = [](SessionOptions session) {
        Policy policy = load_policy("trusted-local");
        policy.limits.wall_time = 10s;
        return make_backend("local")->open_session(policy, std::move(session));
      };
    }
    if (options.max_timeout == 0ms) options.max_timeout = 10s;
    engine_ = std::thread([this, options = std::move(options)]() mutable {
      try {
        serve_repl(std::move(options), to_repl_[0], from_repl_[1]);
      } catch (...) {
        failure_ = std::current_exception();
      }
      close(from_repl_[1]);  // the test reads the end of the output once the engine returned
      returned_ = true;
    });
  }
  ~Repl() {
    end_input();
    if (engine_.joinable()) engine_.join();
    close(to_repl_[0]);
    if (from_repl_[0] >= 0) close(from_repl_[0]);
  }

  void send(const std::string& line) {
    const std::string text = line + "\n";
    ASSERT_EQ(write(to_repl_[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  void send(const json& request) { send(request.dump()); }

  // The orchestrator closes its end of the output: what the engine writes then fails (EPIPE).
  void stop_reading() {
    close(from_repl_[0]);
    from_repl_[0] = -1;
  }

  void end_input() {
    if (to_repl_[1] >= 0) close(to_repl_[1]);
    to_repl_[1] = -1;
  }

  // The next line the engine wrote, parsed; nullopt at the end of its output or after 30 s.
  std::optional<json> next() {
    for (;;) {
      if (const auto end = buffer_.find('\n'); end != std::string::npos) {
        const std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return json::parse(line);
      }
      pollfd readable{from_repl_[0], POLLIN, 0};
      if (poll(&readable, 1, 30'000) <= 0) return std::nullopt;
      char chunk[4096];
      const ssize_t got = read(from_repl_[0], chunk, sizeof chunk);
      if (got <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(got));
    }
  }

  // Waits for serve_repl to return; rethrows what it threw.
  void finish() {
    engine_.join();
    if (failure_) std::rethrow_exception(failure_);
  }
  bool finished_within(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!returned_ && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    return returned_;
  }

 private:
  int to_repl_[2] = {-1, -1};
  int from_repl_[2] = {-1, -1};
  std::string buffer_;
  std::exception_ptr failure_;
  std::atomic<bool> returned_ = false;
  std::thread engine_;
};

TEST(ReplEngine, TheFirstLineGivesTheContextAndAnExecuteGivesItsOutput) {
  Repl repl{ReplOptions{}};
  repl.send(json{{"op", "context"}, {"context", "hello"}});
  const auto ready = repl.next();
  ASSERT_TRUE(ready);
  EXPECT_EQ((*ready)["event"], "ready");
  EXPECT_EQ((*ready)["backend"], "local");

  repl.send(json{{"id", 1}, {"op", "execute"}, {"code", "print(len(context))"}});
  const auto answer = repl.next();
  ASSERT_TRUE(answer);
  EXPECT_EQ((*answer)["id"], 1);
  EXPECT_EQ((*answer)["result"]["status"], "ok") << answer->dump();
  EXPECT_EQ((*answer)["result"]["stdout"], "5\n");

  repl.send(json{{"id", "bye"}, {"op", "close"}});
  const auto closed = repl.next();
  ASSERT_TRUE(closed);
  EXPECT_EQ((*closed)["id"], "bye");
  EXPECT_TRUE(closed->contains("result"));
  repl.finish();
  EXPECT_FALSE(repl.next()) << "nothing after close";
}

TEST(ReplEngine, AnLlmQueryIsAnsweredByTheOrchestratorsLlmResultLine) {
  Repl repl{ReplOptions{}};
  repl.send(json{{"id", "a"}, {"op", "execute"}, {"code", "print(llm_query('2+2?'))"}});
  ASSERT_EQ(repl.next().value_or(json())["event"], "ready");

  const auto query = repl.next();
  ASSERT_TRUE(query);
  EXPECT_EQ((*query)["event"], "llm_query");
  EXPECT_EQ((*query)["id"], "a");
  EXPECT_EQ((*query)["prompt"], "2+2?");
  EXPECT_EQ((*query)["kind"], "llm");
  ASSERT_TRUE((*query)["query_id"].is_number_unsigned());

  // An answer to no waiting query is refused; the cell still waits for the right one.
  repl.send(json{{"id", 7}, {"op", "llm_result"}, {"query_id", 999}, {"text", "?"}});
  const auto refused = repl.next();
  ASSERT_TRUE(refused);
  EXPECT_EQ((*refused)["id"], 7);
  EXPECT_EQ((*refused)["error"], "no llm_query is waiting with query_id 999");

  repl.send(json{{"op", "llm_result"}, {"query_id", (*query)["query_id"]}, {"text", "four"}});
  const auto result = repl.next();
  ASSERT_TRUE(result);
  EXPECT_EQ((*result)["id"], "a");
  EXPECT_EQ((*result)["result"]["stdout"], "four\n") << result->dump();
  EXPECT_EQ((*result)["result"]["llm_calls"], 1);
}

// The bulk side channel: a long text prompt leaves as a file of its own in the orchestrator's
// directory (mode 0600), a short one and a message list in the line as before.
TEST(ReplEngine, ALongPromptLeavesThroughTheBulkDirectory) {
  char dir_template[] = "/tmp/rlm-test-bulk-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  ReplOptions options;
  options.bulk_dir = dir;
  Repl repl{options};
  repl.send(json{{"id", 1},
                 {"op", "execute"},
                 {"code",
                  "a = llm_query('x' * 100000 + 'end')\nb = llm_query('short')\n"
                  "c = llm_query([{'role': 'user', 'content': 'y' * 100000}])\n"
                  "print(a, b, c)"}});
  ASSERT_EQ(repl.next().value_or(json())["event"], "ready");
  std::vector<std::string> answers = {"A", "B", "C"};
  for (std::size_t i = 0; i < answers.size(); ++i) {
    const auto query = repl.next();
    ASSERT_TRUE(query && (*query)["event"] == "llm_query") << (query ? query->dump() : "");
    if (i == 0) {
      ASSERT_FALSE(query->contains("prompt")) << query->dump().substr(0, 300);
      const std::string path = (*query)["prompt_file"];
      EXPECT_EQ(path.rfind(dir + "/", 0), 0u) << path;
      EXPECT_EQ((*query)["prompt_bytes"], 100003);
      struct stat info {};
      ASSERT_EQ(stat(path.c_str(), &info), 0);
      EXPECT_EQ(info.st_mode & 0777, 0600u);
      std::ifstream file(path, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(file)), {});
      EXPECT_EQ(text, std::string(100000, 'x') + "end");
      EXPECT_EQ(unlink(path.c_str()), 0);
    } else if (i == 1) {
      EXPECT_EQ((*query)["prompt"], "short");
    } else {
      EXPECT_EQ((*query)["prompt"][0]["content"], std::string(100000, 'y')) << "JSON stays inline";
    }
    repl.send(json{{"op", "llm_result"}, {"query_id", (*query)["query_id"]}, {"text", answers[i]}});
  }
  const auto result = repl.next();
  ASSERT_TRUE(result);
  EXPECT_EQ((*result)["result"]["stdout"], "A B C\n") << result->dump();
  repl.end_input();
  repl.finish();
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "the orchestrator removed the only file";
}

TEST(ReplEngine, AMalformedLineGetsOneErrorAndTheReplGoesOn) {
  Repl repl{ReplOptions{}};
  repl.send(json{{"op", "context"}, {"context", "x"}});
  ASSERT_EQ(repl.next().value_or(json())["event"], "ready");

  repl.send(std::string("this is not json"));
  const auto error = repl.next();
  ASSERT_TRUE(error);
  EXPECT_EQ(*error, (json{{"id", nullptr}, {"error", "not a JSON object: this is not json"}}));

  repl.send(json{{"id", 2}, {"op", "execute"}, {"code", "1"}, {"colour", "red"}});
  const auto unknown = repl.next();
  ASSERT_TRUE(unknown);
  EXPECT_EQ((*unknown)["id"], 2);
  EXPECT_EQ((*unknown)["error"], "unknown key 'colour' for op execute");

  repl.send(std::string("   "));  // blank: no answer at all
  repl.send(json{{"id", 3}, {"op", "execute"}, {"code", "print('still here')"}});
  const auto answer = repl.next();
  ASSERT_TRUE(answer);
  EXPECT_EQ((*answer)["id"], 3);
  EXPECT_EQ((*answer)["result"]["stdout"], "still here\n");
}

TEST(ReplEngine, TheEndOfInputClosesTheSessionAndReturns) {
  Repl repl{ReplOptions{}};
  repl.send(json{{"id", 1}, {"op", "execute"}, {"code", "x = 1"}});
  ASSERT_EQ(repl.next().value_or(json())["event"], "ready");
  ASSERT_EQ(repl.next().value_or(json())["id"], 1);
  repl.end_input();
  EXPECT_TRUE(repl.finished_within(20s));
  repl.finish();
  EXPECT_FALSE(repl.next()) << "no line after the end of the input";
}

TEST(ReplEngine, WithAnLmHandlerCallsAreAnsweredOnTheHostAndLlmResultIsRefused) {
  ReplOptions options;
  options.session.llm = std::make_shared<FixedAnswer>();
  options.policy_name = "trusted-local";
  options.session.context_file = "/dev/null";  // opens, and says ready, at once
  Repl repl{std::move(options)};
  const auto ready = repl.next();
  ASSERT_TRUE(ready);
  EXPECT_EQ(*ready, (json{{"event", "ready"}, {"backend", "local"}, {"policy", "trusted-local"}}));

  repl.send(json{{"id", 4}, {"op", "llm_result"}, {"query_id", 1}, {"text", "x"}});
  const auto refused = repl.next();
  ASSERT_TRUE(refused);
  EXPECT_EQ((*refused)["error"], "llm_result without a pending llm_query (--lm is set)");

  repl.send(json{{"id", 5}, {"op", "execute"}, {"code", "print(llm_query('q'))"}});
  const auto answer = repl.next();
  ASSERT_TRUE(answer);
  EXPECT_EQ((*answer)["result"]["stdout"], "fixed\n") << answer->dump();
}

TEST(ReplEngine, ASessionThatCannotOpenThrowsAndWritesNothing) {
  ReplOptions options;
  options.session.context_file = "/dev/null";
  options.open_session = [](SessionOptions) -> std::unique_ptr<Session> {
    throw Error("no sandbox today");
  };
  Repl repl{std::move(options)};
  EXPECT_THROW(repl.finish(), Error);
  EXPECT_FALSE(repl.next());
}

TEST(ReplEngine, ToolsTextIsCheckedAsTheToolsFlagTakesIt) {
  EXPECT_EQ(repl_tools_from_text(R"([{"name": "lookup"}])").size(), 1u);
  EXPECT_THROW(repl_tools_from_text("[{"), Error);
  EXPECT_THROW(repl_tools_from_text(std::string(100, '[') + std::string(100, ']')), Error);
  EXPECT_THROW(repl_tools_from_text(R"([{"name": "not an identifier"}])"), Error);
}

// A closed input is an input that has ended: the engine returns. (The reader's stop eventfd took
// the closed input's number once, and the reader then waited on it as its input for ever.)
TEST(ReplEngine, AClosedInputEndsTheRepl) {
  int output[2];
  ASSERT_EQ(pipe2(output, O_CLOEXEC), 0);
  // The lowest free number, closed again: the next fd opened would be given it.
  const int closed_input = dup(output[0]);
  ASSERT_GE(closed_input, 0);
  close(closed_input);
  ReplOptions options;
  options.open_session = [](SessionOptions) -> std::unique_ptr<Session> {
    throw Error("no session is wanted here");
  };
  options.max_timeout = 10s;
  std::atomic<bool> returned = false;
  std::thread engine([&] {
    try {
      serve_repl(options, closed_input, output[1]);
    } catch (const Error&) {
    }
    returned = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!returned && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  if (!returned) {
    ADD_FAILURE() << "serve_repl still waits on a closed input after a minute";
    std::_Exit(1);  // its thread cannot be joined: end here rather than hang the suite
  }
  engine.join();
  close(output[0]);
  close(output[1]);
}

// An orchestrator that closes its end of the output: the engine's writes fail, the process is
// not killed by SIGPIPE (whose default action, set here, would end the test process),
// and the engine still ends with its input.
TEST(ReplEngine, AnOrchestratorThatStopsReadingDoesNotKillTheProcess) {
  // SIGPIPE's default action for this test, whatever the test process inherited.
  const auto inherited = signal(SIGPIPE, SIG_DFL);
  Repl repl{ReplOptions{}};
  repl.send(json{{"op", "context"}, {"context", "hello"}});
  ASSERT_TRUE(repl.next());  // ready
  repl.stop_reading();
  repl.send(json{{"id", 1}, {"op", "execute"}, {"code", "print('into a closed pipe')"}});
  repl.send(json{{"op", "bogus"}});  // an error line, written at once, into the closed pipe
  repl.end_input();
  EXPECT_TRUE(repl.finished_within(60s)) << "serve_repl did not return";
  signal(SIGPIPE, inherited);
}

}  // namespace
}  // namespace rlm
