// `rlm-sandbox repl` as an orchestrator drives it: JSON lines in, JSON lines out, with the
// orchestrator itself answering llm_query events.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"
#include "repl_driver.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

TEST(CliRepl, TheOrchestratorAnswersLlmQueriesAndStatePersists) {
  Repl repl({"--backend", "namespace"});
  repl.send({{"op", "context"}, {"context", "a long prompt"}});
  auto ready = repl.next();
  ASSERT_EQ(ready.value("event", ""), "ready") << ready.dump();
  EXPECT_EQ(ready["backend"], "namespace");

  repl.send({{"id", 1}, {"op", "execute"}, {"code", "x = 41"}});
  EXPECT_EQ(repl.next()["result"]["status"], "ok");
  repl.send({{"id", 2},
             {"op", "execute"},
             {"code", "print(x + 1, len(context))\nreply = llm_query('ping', model='small')"}});
  auto query = repl.next();
  ASSERT_EQ(query.value("event", ""), "llm_query") << query.dump();
  EXPECT_EQ(query["id"], 2);
  EXPECT_EQ(query["prompt"], "ping");
  EXPECT_EQ(query["model"], "small");
  repl.send({{"op", "llm_result"}, {"query_id", query["query_id"]}, {"text", "pong"}});
  auto result = repl.next();
  EXPECT_EQ(result["id"], 2);
  EXPECT_EQ(result["result"]["status"], "ok") << result.dump();
  EXPECT_EQ(result["result"]["stdout"], "42 13\n");
  EXPECT_EQ(result["result"]["llm_calls"], 1);

  repl.send({{"id", 3}, {"op", "execute"}, {"code", "FINAL_VAR('reply')"}});
  auto final = repl.next();
  EXPECT_EQ(final["result"]["final"], "pong") << final.dump();

  repl.send({{"id", 4}, {"op", "close"}});
  auto closed = repl.next();
  EXPECT_EQ(closed["id"], 4);
  EXPECT_EQ(closed["result"]["backend"], "namespace");
  EXPECT_EQ(repl.wait_exit(), 0);
}

// llm_query returns the RLM library's "Error: ..." text for a failed call (it does not raise).
TEST(CliRepl, AnErrorAnswerFromTheOrchestratorIsTheErrorTextInTheCell) {
  Repl repl({"--backend", "namespace"});
  repl.send({{"id", 1}, {"op", "execute"}, {"code", "print('failed:', llm_query('q'))"}});
  ASSERT_EQ(repl.next()["event"], "ready");
  auto query = repl.next();
  repl.send({{"op", "llm_result"}, {"query_id", query["query_id"]}, {"error", "rate limited"}});
  EXPECT_EQ(repl.next()["result"]["stdout"], "failed: Error: rate limited\n");
}

TEST(CliRepl, WithAnLmHandlerNoEventsReachTheOrchestrator) {
  TempDir dir;
  dir.write("context.txt", "file context");
  ProcessOptions options;
  options.stdin_data = R"x({"id":"a","op":"execute","code":"print(llm_query(context))"})x"
                       "\n";
  auto outcome = cli({"repl", "--lm", "echo", "--context", dir.file("context.txt")}, options);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  std::vector<json> lines;
  std::istringstream stream(outcome.out);
  for (std::string line; std::getline(stream, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << outcome.out;
  EXPECT_EQ(lines[0]["event"], "ready");
  EXPECT_EQ(lines[1]["id"], "a");
  EXPECT_EQ(lines[1]["result"]["stdout"], "echo: file context\n");
}

// repl takes the mounts and environment flags run does: the session sees the bound directory
// (read-only) and the variables, from the command line and from a file.
TEST(CliRepl, MountAndEnvironmentFlagsReachTheSession) {
  TempDir dir;
  dir.write("input.txt", "data");
  dir.write("env", "# from a file\nFROM_FILE=yes\n");
  chmod(dir.path().c_str(), 0755);
  ProcessOptions options;
  options.extra_env["RLM_TEST_CALLERS"] = "the caller's";
  options.stdin_data =
      R"x({"id":1,"op":"execute","code":"import os\nprint(open('/data/input.txt').read(), os.environ['GREETING'], os.environ['FROM_FILE'], os.environ['RLM_TEST_CALLERS'])\ntry:\n    open('/data/new', 'w')\nexcept OSError as e:\n    print(e.strerror)"})x"
      "\n";
  auto outcome = cli({"repl", "--lm", "echo", "--bind-ro", dir.path() + ":/data", "-e",
                      "GREETING=hi", "-e", "RLM_TEST_CALLERS", "--env-file", dir.file("env")},
                     options);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  std::istringstream stream(outcome.out);
  std::string ready, cell;
  std::getline(stream, ready);
  std::getline(stream, cell);
  const auto result = json::parse(cell, nullptr, false);
  ASSERT_TRUE(result.is_object()) << outcome.out;
  EXPECT_EQ(result["result"]["stdout"], "data hi yes the caller's\nRead-only file system\n")
      << cell;
}

TEST(CliRepl, BadRequestsGetAnErrorLineAndTheSessionGoesOn) {
  ProcessOptions options;
  options.stdin_data =
      "not json\n"
      R"({"id":1,"op":"explode"})"
      "\n"
      R"({"id":2,"op":"execute"})"
      "\n"
      R"({"id":3,"op":"restore","snapshot":99})"
      "\n"
      R"x({"id":4,"op":"execute","code":"print('still here')"})x"
      "\n";
  auto outcome = cli({"repl", "--lm", "echo"}, options);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_NE(outcome.out.find(R"("error":"not a JSON object: not json")"), std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find("unknown op 'explode'"), std::string::npos);
  EXPECT_NE(outcome.out.find(R"(execute needs \"code\")"), std::string::npos);
  EXPECT_NE(outcome.out.find("no snapshot 99"), std::string::npos);
  EXPECT_NE(outcome.out.find(R"("stdout":"still here\n")"), std::string::npos);
}

TEST(CliRepl, SetupMistakesExitWithAMessage) {
  auto missing = cli({"repl", "--context", "/nonexistent/prompt.txt"});
  EXPECT_EQ(missing.exit_code, 125);
  EXPECT_NE(missing.err.find("/nonexistent/prompt.txt"), std::string::npos) << missing.err;
  EXPECT_TRUE(one_line(missing.err)) << missing.err;
  auto bad_lm = cli({"repl", "--lm", "carrier-pigeon"});
  EXPECT_EQ(bad_lm.exit_code, 125);
  EXPECT_NE(bad_lm.err.find("carrier-pigeon"), std::string::npos) << bad_lm.err;
  auto unknown_flag = cli({"repl", "--frobnicate"});
  EXPECT_EQ(unknown_flag.exit_code, 2);
  auto help = cli({"repl", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("llm_query"), std::string::npos);
  for (const char* taught : {"--no-echo", "--tools", "add_context", "add_history", "\"kind\"",
                             "\"value\"", "\"locals\"", "\"fetch\"", "\"answer\"", "rlm_query"})
    EXPECT_NE(help.out.find(taught), std::string::npos) << taught;
  for (const char* tools : {R"([{"name": "llm_query"}])", R"([{"name": 5}])", "[", R"({"a": 1})",
                            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}) {
    auto bad_tools = cli({"repl", "--lm", "echo", "--tools", tools});
    EXPECT_EQ(bad_tools.exit_code, 125) << tools;
    EXPECT_NE(bad_tools.err.find("--tools"), std::string::npos) << bad_tools.err;
    EXPECT_TRUE(one_line(bad_tools.err)) << bad_tools.err;
  }
}

// Issue 13 over JSON lines: --no-echo, --tools (a function the orchestrator answers with a value,
// a data tool), events with their kind and message-list prompts, execute's locals and fetch, the
// answer finish, and contexts and histories added to the live session.
TEST(CliRepl, TheRlmProtocolOverJsonLines) {
  TempDir dir;
  const auto file = dir.path() + "/context.json";
  { std::ofstream(file) << R"({"k": "from a file"})"; }
  Repl repl(
      {"--backend", "namespace", "--no-echo", "--tools",
       R"([{"name": "lookup", "description": "finds"}, {"name": "limits", "value": {"max": 3}}])"});
  repl.send({{"op", "context"}, {"context", "first"}});
  ASSERT_EQ(repl.next().value("event", ""), "ready");
  repl.send({{"id", 1},
             {"op", "execute"},
             {"code",
              "r = lookup('w', k=1)\nprint(r, limits['max'])\n"
              "m = llm_query([{'role': 'user', 'content': 'hi'}])\nq = rlm_query('sub')\n6 * 7"}});
  auto tool = repl.next();
  EXPECT_EQ(tool["kind"], "tool") << tool.dump();
  EXPECT_EQ(tool["tool"], "lookup");
  EXPECT_EQ(tool["prompt"], json::parse(R"({"args": ["w"], "kwargs": {"k": 1}})"));
  EXPECT_EQ(tool["model"], nullptr);
  repl.send({{"op", "llm_result"}, {"query_id", tool["query_id"]}, {"value", {{"found", true}}}});
  auto messages = repl.next();
  EXPECT_EQ(messages["kind"], "llm") << messages.dump();
  EXPECT_FALSE(messages.contains("tool"));
  EXPECT_EQ(messages["prompt"], json::parse(R"([{"role": "user", "content": "hi"}])"));
  repl.send({{"op", "llm_result"}, {"query_id", messages["query_id"]}, {"text", "m-answer"}});
  auto sub = repl.next();
  EXPECT_EQ(sub["kind"], "rlm") << sub.dump();
  EXPECT_EQ(sub["prompt"], "sub");
  repl.send({{"id", "v"}, {"op", "llm_result"}, {"query_id", sub["query_id"]}, {"value", 1}});
  auto refused = repl.next();
  EXPECT_EQ(refused["id"], "v") << refused.dump();
  EXPECT_NE(refused.value("error", "").find("no tool call"), std::string::npos) << refused.dump();
  repl.send({{"op", "llm_result"}, {"query_id", sub["query_id"]}, {"text", "sub-answer"}});
  auto ran = repl.next();
  EXPECT_EQ(ran["id"], 1) << ran.dump();
  EXPECT_EQ(ran["result"]["status"], "ok") << ran.dump();
  EXPECT_EQ(ran["result"]["stdout"], "{'found': True} 3\n") << "no echo of 6 * 7";
  EXPECT_EQ(ran["result"]["llm_calls"], 3);
  EXPECT_FALSE(ran["result"].contains("answer"));
  EXPECT_FALSE(ran["result"].contains("locals"));

  repl.send({{"id", 2},
             {"op", "execute"},
             {"code", "answer['content'] = m + ' ' + q\nanswer['ready'] = True"},
             {"locals", true},
             {"fetch", "q"}});
  auto finished = repl.next()["result"];
  EXPECT_EQ(finished["answer"], "m-answer sub-answer") << finished.dump();
  EXPECT_EQ(finished["fetched"], json({{"value", "sub-answer"}}));
  ASSERT_TRUE(finished["locals"].is_array()) << finished.dump();
  bool listed = false;
  for (const auto& item : finished["locals"])
    listed |= item["name"] == "q" && item["type"] == "str" && item["repr"] == "'sub-answer'";
  EXPECT_TRUE(listed) << finished["locals"].dump();

  repl.send({{"id", 3}, {"op", "add_context"}, {"context", "second"}});
  auto second = repl.next();
  EXPECT_EQ(second["id"], 3);
  EXPECT_EQ(second["result"]["index"], 1) << second.dump();
  repl.send({{"id", 4}, {"op", "add_context"}, {"context_file", file}, {"json", true}});
  EXPECT_EQ(repl.next()["result"]["index"], 2);
  repl.send({{"id", 5}, {"op", "add_context"}, {"context", {{"n", 5}}}, {"index", 9}});
  EXPECT_EQ(repl.next()["result"]["index"], 9);
  repl.send({{"id", 6},
             {"op", "add_history"},
             {"history", json::parse(R"([{"role": "user", "content": "h"}])")}});
  EXPECT_EQ(repl.next()["result"]["index"], 0);
  repl.send({{"id", 7},
             {"op", "execute"},
             {"code",
              "print(context, context_1, context_2['k'], context_9['n'], history[0]['content'])"}});
  EXPECT_EQ(repl.next()["result"]["stdout"], "first second from a file 5 h\n");
}

}  // namespace
}  // namespace rlm::test
