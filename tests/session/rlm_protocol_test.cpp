// Issue 13 end to end through a real worker in a namespace sandbox: what the RLM libraries expect
// of a session -- host-side tools, no echo, the cells' locals and one variable fetched, the
// `answer` finish, contexts and histories added to a live session, and the session's own LM limits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "namespace_session_fixture.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string dump(const CellResult& cell) {
  auto text = cell.to_json().dump();
  return text.size() > 4000 ? text.substr(0, 4000) + "..." : text;
}

// Answers tool calls with {"tool", "args", "kwargs"} (the tool `fail` with an error), and LM
// calls with "<kind>: <prompt>"; counts the calls it is given.
class ToolLm final : public LlmHandler {
 public:
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    ++calls_;
    if (call.kind != CallKind::tool)
      return done(LlmAnswer::of_text(std::string(to_string(call.kind)) + ": " + call.prompt));
    if (call.tool == "fail") return done(LlmAnswer::of_error("the tool broke"));
    auto arguments = json::parse(call.prompt);
    arguments["tool"] = call.tool;
    done(LlmAnswer::of_text(arguments.dump()));
  }
  int calls() const { return calls_; }

 private:
  std::atomic<int> calls_{0};
};

using RlmProtocol = NamespaceSessionTest;

TEST_F(RlmProtocol, ToolsAreHostFunctionsOrValuesAndSurviveACellThatRebindsThem) {
  auto lm = std::make_shared<ToolLm>();
  SessionOptions options;
  options.llm = lm;
  options.tools = {{"lookup", "finds a word", std::nullopt},
                   {"fail", "", std::nullopt},
                   {"limits", "the caps", json{{"max", 3}}}};
  auto session = open(options);
  auto call = session->execute("print(lookup('w', 2, deep={'k': [1]}), limits['max'])");
  EXPECT_EQ(call.status, CellStatus::ok) << dump(call);
  EXPECT_EQ(call.stdout_data,
            "{'args': ['w', 2], 'kwargs': {'deep': {'k': [1]}}, 'tool': 'lookup'} 3\n");
  EXPECT_EQ(call.llm_calls, 1u);
  auto failed = session->execute("fail()");
  EXPECT_EQ(failed.status, CellStatus::error) << dump(failed);
  EXPECT_NE(failed.error.find("RuntimeError: the tool broke"), std::string::npos) << failed.error;
  ASSERT_EQ(session->execute("lookup = None\nlimits = 0").status, CellStatus::ok);
  auto again = session->execute("print(lookup('x')['args'], limits)");
  EXPECT_EQ(again.stdout_data, "['x'] {'max': 3}\n") << dump(again);
  EXPECT_EQ(lm->calls(), 3);
}

TEST_F(RlmProtocol, ToolsAreValidatedBeforeAnySandboxStarts) {
  for (const auto& name : {"llm_query", "context_3", "answer", "class", "2x", "a-b", "__x", ""}) {
    SessionOptions options;
    options.tools = {{name, "", std::nullopt}};
    EXPECT_THROW(open(options), Error) << name;
  }
  SessionOptions twice;
  twice.tools = {{"t", "", std::nullopt}, {"t", "", json(1)}};
  EXPECT_THROW(open(twice), Error);
  SessionOptions many;
  for (int i = 0; i <= 64; ++i) many.tools.push_back({"t" + std::to_string(i), "", std::nullopt});
  EXPECT_THROW(open(many), Error);
  SessionOptions large;
  large.tools = {{"big", "", json(std::string(2u << 20, 'x'))}};
  EXPECT_THROW(open(large), Error);
}

// A "python" tool's arguments and answer are _pyvalues.py's tagged JSON: the host passes them on
// untouched, so a tuple, a set, bytes and a dict's key order go there and back, and an exception
// the answer carries is raised in the cell as its own type.
class EchoFirstArgument final : public LlmHandler {
 public:
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    if (call.tool == "raises")
      return done(LlmAnswer::of_text(R"({"e": ["KeyError", "KeyError", ["k"]]})"));
    done(LlmAnswer::of_text(json::parse(call.prompt)["args"][0].dump()));
  }
};

TEST_F(RlmProtocol, PythonEncodedToolsKeepTypesOrderAndExceptionTypes) {
  SessionOptions options;
  options.llm = std::make_shared<EchoFirstArgument>();
  options.tools = {
      {"same", "", std::nullopt, ToolEncoding::python},
      {"raises", "", std::nullopt, ToolEncoding::python},
      {"data", "",
       json{{"d", json::array({json::array({"z", 1}), json::array({"a", json{{"t", {1, 2}}}})})}},
       ToolEncoding::python},
      {"broken", "", json{{"u", "a DataFrame is no JSON"}}, ToolEncoding::python}};
  EXPECT_EQ(tools_from_json(tools_to_json(options.tools))[2].encoding, ToolEncoding::python);
  EXPECT_EQ(tools_from_json(tools_to_json(options.tools))[2].value, options.tools[2].value);
  EXPECT_THROW(tools_from_json(json::parse(R"([{"name": "t", "encoding": "xml"}])")), Error);
  auto session = open(options);
  auto cell = session->execute(
      "v = same({'z': (1, {2}), 'a': b'\\x00'})\n"
      "print(v, list(v))\n"
      "print(data, list(data))\n"
      "try:\n    raises()\nexcept KeyError as error:\n    print(repr(error))\n"
      "try:\n    len(broken)\nexcept TypeError as error:\n    print(error)");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data,
            "{'z': (1, {2}), 'a': b'\\x00'} ['z', 'a']\n"
            "{'z': 1, 'a': (1, 2)} ['z', 'a']\n"
            "KeyError('k')\n"
            "the value of broken could not be sent to the sandbox: a DataFrame is no JSON\n");
}

TEST_F(RlmProtocol, WithoutEchoATrailingExpressionPrintsNothing) {
  SessionOptions options;
  options.echo_expression = false;
  auto session = open(options);
  auto cell = session->execute("x = 41\nx + 1");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data, "");
  EXPECT_EQ(session->execute("print(x + 1)").stdout_data, "42\n");
  EXPECT_EQ(open()->execute("6 * 7").stdout_data, "42\n") << "echo is on by default";
}

TEST_F(RlmProtocol, LocalsListTheCellsVariablesAndFetchTakesOneAsJson) {
  auto session = open();
  ExecuteOptions with_locals;
  with_locals.locals = true;
  auto cell = session->execute("import os\nx = 41\nlong = 'a' * 500\n_hidden = 1", with_locals);
  ASSERT_EQ(cell.status, CellStatus::ok) << dump(cell);
  ASSERT_TRUE(cell.locals.has_value()) << dump(cell);
  std::map<std::string, json> by_name;
  for (const auto& item : *cell.locals) by_name[item["name"].get<std::string>()] = item;
  ASSERT_TRUE(by_name.count("x")) << cell.locals->dump();
  EXPECT_EQ(by_name["x"]["type"], "int");
  EXPECT_EQ(by_name["x"]["repr"], "41");
  EXPECT_EQ(by_name["x"]["value"], 41) << "a small JSON value crosses as itself";
  ASSERT_TRUE(by_name.count("long"));
  EXPECT_LE(by_name["long"]["repr"].get<std::string>().size(), 200u);
  EXPECT_EQ(by_name["long"]["value"], std::string(500, 'a'));
  EXPECT_FALSE(by_name.count("_hidden"));
  EXPECT_FALSE(by_name.count("os")) << "modules are not listed";
  EXPECT_FALSE(by_name.count("llm_query")) << "the reserved names are not listed";
  EXPECT_FALSE(session->execute("x").locals.has_value()) << "only when asked";

  ExecuteOptions fetch;
  fetch.fetch = "x";
  auto fetched = session->execute("x += 1", fetch);
  ASSERT_TRUE(fetched.fetched.has_value()) << dump(fetched);
  EXPECT_EQ(*fetched.fetched, json({{"value", 42}})) << "taken after the code ran";
  fetch.fetch = "nope";
  auto missing = session->execute("", fetch);
  ASSERT_TRUE(missing.fetched.has_value()) << dump(missing);
  EXPECT_EQ(*missing.fetched, json({{"error", "no variable named 'nope'"}}));
  fetch.fetch = "odd";
  auto repr = session->execute("odd = {1}", fetch);
  ASSERT_TRUE(repr.fetched.has_value()) << dump(repr);
  EXPECT_EQ(*repr.fetched, json({{"value", "{1}"}})) << "not JSON: its repr";
  EXPECT_EQ(cell_result_from_json(repr.to_json()).fetched, repr.fetched);
}

TEST_F(RlmProtocol, AnAnswerMarkedReadyIsReportedOnce) {
  auto session = open();
  auto ready = session->execute("answer['content'] = 42\nanswer['ready'] = True");
  EXPECT_EQ(ready.status, CellStatus::ok) << dump(ready);
  ASSERT_TRUE(ready.answer.has_value()) << dump(ready);
  EXPECT_EQ(*ready.answer, "42");
  EXPECT_EQ(ready.to_json()["answer"], "42");
  EXPECT_EQ(cell_result_from_json(ready.to_json()).answer, "42");
  auto after = session->execute("y = 1");
  EXPECT_FALSE(after.answer.has_value()) << dump(after);
  EXPECT_FALSE(after.to_json().contains("answer"));
}

TEST_F(RlmProtocol, ContextsAndHistoriesAddedToALiveSessionSurviveRollbacks) {
  SessionOptions options;
  options.context = "first";
  auto session = open(options);
  auto text = session->add_context(ContextKind::context, {"second", false, ""});
  EXPECT_EQ(text.status, CellStatus::ok) << dump(text);
  EXPECT_EQ(text.index, 1u);
  auto structured = session->add_context(ContextKind::context, {R"({"a": [1, 2]})", true, ""}, 5);
  EXPECT_EQ(structured.index, 5u) << dump(structured);
  TempDir dir;
  const auto path = dir.path() + "/third.txt";
  std::ofstream(path) << "from a file";
  auto file = session->add_context(ContextKind::context, {"", false, path});
  EXPECT_EQ(file.index, 6u) << dump(file);
  auto history = session->add_context(ContextKind::history,
                                      {R"([{"role": "user", "content": "hi"}])", true, ""});
  EXPECT_EQ(history.index, 0u) << dump(history);
  auto bad = session->add_context(ContextKind::context, {"{not json", true, ""});
  EXPECT_EQ(bad.status, CellStatus::error) << dump(bad);
  EXPECT_NE(bad.error.find("JSON"), std::string::npos) << bad.error;

  auto spin = session->execute("context_1 = 'changed'\nwhile True: pass", 500ms);
  EXPECT_EQ(spin.status, CellStatus::timeout) << dump(spin);
  auto seen = session->execute(
      "print(context, context_0, context_1, context_5['a'], context_6, history[0]['content'], "
      "history is history_0, 'context_7' in globals())");
  EXPECT_EQ(seen.stdout_data, "first first second [1, 2] from a file hi True False\n")
      << dump(seen);
  EXPECT_THROW(session->add_context(ContextKind::context, {"", false, dir.path() + "/none"}),
               Error);
}

TEST_F(RlmProtocol, AContextLargerThanAFrameCrossesAsAnFd) {
  auto session = open();
  const std::string big = std::string(20u << 20, 'x') + "needle";
  auto added = session->add_context(ContextKind::context, {big, false, ""});
  EXPECT_EQ(added.status, CellStatus::ok) << dump(added);
  auto found = session->execute("print(len(context_" + std::to_string(added.index.value_or(99)) +
                                "), context_" + std::to_string(added.index.value_or(99)) +
                                ".find('needle'))");
  EXPECT_EQ(found.stdout_data, std::to_string(big.size()) + " " + std::to_string(20u << 20) + "\n")
      << dump(found);
}

TEST_F(RlmProtocol, TheSessionHoldsItsHandlerToItsOwnLimits) {
  auto lm = std::make_shared<ToolLm>();
  SessionOptions options;
  options.llm = lm;
  options.llm_limits.budget = 2;
  auto session = open(options);
  auto cell = session->execute("print(llm_query('a'), rlm_query('b'))\nprint(llm_query('c')[:80])");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_NE(cell.stdout_data.find("llm: a rlm: b\n"), std::string::npos) << dump(cell);
  EXPECT_NE(cell.stdout_data.find("budget exhausted"), std::string::npos) << dump(cell);
  EXPECT_EQ(lm->calls(), 2);
  EXPECT_EQ(cell.llm_calls, 3u);
}

}  // namespace
}  // namespace rlm::test
