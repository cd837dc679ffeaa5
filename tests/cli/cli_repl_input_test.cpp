// The orchestrator's own lines as an attacker would write them (issue 11, line 7): wrong types,
// nesting 100,000 deep, numbers out of range, a line longer than any frame. Each gets exactly one
// {"id", "error"} line, with the line's id when it had a usable one, and the repl goes on.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

std::vector<json> lines_of(const std::string& out) {
  std::vector<json> lines;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) {
    json parsed = json::parse(line, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << line.substr(0, 200);
    lines.push_back(std::move(parsed));
  }
  return lines;
}

// The error lines of `lines`, each checked to be {"id", "error": string} and nothing else.
std::vector<json> error_ids(const std::vector<json>& lines) {
  std::vector<json> ids;
  for (const auto& line : lines) {
    if (!line.contains("error")) continue;
    EXPECT_EQ(line.size(), 2u) << line.dump().substr(0, 300);
    EXPECT_TRUE(line["error"].is_string());
    EXPECT_LT(line["error"].get<std::string>().size(), 400u);
    ids.push_back(line.value("id", json("missing")));
  }
  return ids;
}

TEST(CliReplInput, EveryMalformedLineGetsOneErrorAndTheReplGoesOn) {
  const std::vector<std::pair<std::string, json>> malformed = {
      {R"({"op":1})", nullptr},
      {R"({"id":)" + nested(100'000) + R"(,"op":"execute","code":"1"})", nullptr},
      {R"({"id":3,"op":"execute","code":"pass","timeout_ms":1e300})", 3},
      {R"({"id":4,"op":"execute","code":"pass","timeout_ms":-5})", 4},
      {R"({"id":5,"op":"execute","code":"pass","timeout_ms":1.5})", 5},
      {R"({"id":6,"op":"execute","code":"pass","timeout_ms":"100"})", 6},
      {R"x({"id":7,"op":"execute","code":["print(1)"]})x", 7},
      {R"({"id":{"a":1},"op":"close"})", nullptr},  // not a close: its id is not usable
      {R"({"id":9.5,"op":"close"})", nullptr},
      {R"({"id":10,"op":"restore","snapshot":-1})", 10},
      {R"({"id":11,"op":"restore","snapshot":"1"})", 11},
      {R"({"id":12,"op":"llm_result","query_id":"x","text":"a"})", 12},
      {R"({"id":13,"op":["execute"]})", 13},
      {R"([1,2,3])", nullptr},
      {R"({"id":15,"op":"execute","code":"pass","timeout":100})", 15},
      {R"({"id":16,"op":"execute","code":"x=1","timeout_ms":18446744073709551615})", 16},
      {R"({"id":true,"op":"execute","code":"pass"})", nullptr},
      {R"({"id":")" + std::string(5000, 'a') + R"(","op":"snapshot"})", nullptr},
      {R"({"id":19,"op":"execute","code":"pass","x":)" + nested(100'000) + "}", nullptr},
      {R"({"id":20,"op":"snapshot","extra":{"deep":)" + nested(100) + "}}", nullptr},
      {"\"just a string\"", nullptr},
      {"{\"id\":22,\"op\":\"execute\",\"code\":\"\xff\xfe\"}", nullptr},  // not UTF-8: not JSON
  };
  ProcessOptions options;
  for (const auto& [line, id] : malformed) options.stdin_data += line + "\n";
  options.stdin_data += R"x({"id":"end","op":"execute","code":"print('still here')"})x"
                        "\n";
  auto outcome = cli({"repl", "--lm", "echo"}, options);
  ASSERT_EQ(outcome.exit_code, 0) << "signal " << outcome.term_signal << ": " << outcome.err;

  const auto lines = lines_of(outcome.out);
  std::vector<json> expected_ids;
  for (const auto& [line, id] : malformed) expected_ids.push_back(id);
  EXPECT_EQ(error_ids(lines), expected_ids) << outcome.out.substr(0, 4000);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().value("id", json()), "end") << lines.back().dump();
  EXPECT_EQ(lines.back()["result"]["stdout"], "still here\n") << lines.back().dump();
  EXPECT_EQ(lines.size(), malformed.size() + 2) << "one line each, a ready and a result";
}

TEST(CliReplInput, ADeeplyNestedFirstLineContextIsRefusedAndTheNextOneTaken) {
  ProcessOptions options;
  options.stdin_data = R"({"op":"context","context":)" + nested(100'000) +
                       "}\n"
                       R"({"op":"context","context":"the real one"})"
                       "\n"
                       R"x({"id":1,"op":"execute","code":"print(context)"})x"
                       "\n";
  auto outcome = cli({"repl", "--lm", "echo"}, options);
  ASSERT_EQ(outcome.exit_code, 0) << "signal " << outcome.term_signal << ": " << outcome.err;
  const auto lines = lines_of(outcome.out);
  ASSERT_EQ(lines.size(), 3u) << outcome.out.substr(0, 2000);
  EXPECT_EQ(lines[0]["id"], nullptr);
  EXPECT_NE(lines[0].value("error", "").find("deep"), std::string::npos) << lines[0].dump();
  EXPECT_EQ(lines[1]["event"], "ready");
  EXPECT_EQ(lines[2]["result"]["stdout"], "the real one\n") << lines[2].dump();
}

TEST(CliReplInput, ALineLongerThanTheBoundIsDroppedWithOneError) {
  ProcessOptions options;
  options.stdin_data = R"({"id":1,"op":"execute","code":"x = ')" + std::string(17u << 20, 'a') +
                       "'\"}\n"
                       R"x({"id":2,"op":"execute","code":"print('after')"})x"
                       "\n";
  auto outcome = cli({"repl", "--lm", "echo"}, options);
  ASSERT_EQ(outcome.exit_code, 0) << "signal " << outcome.term_signal << ": " << outcome.err;
  const auto lines = lines_of(outcome.out);
  ASSERT_EQ(lines.size(), 3u) << outcome.out.substr(0, 2000);
  EXPECT_EQ(lines[0]["id"], nullptr);
  EXPECT_NE(lines[0].value("error", "").find("longer than 16777216 bytes"), std::string::npos)
      << lines[0].dump();
  EXPECT_EQ(lines[1]["event"], "ready");
  EXPECT_EQ(lines[2]["id"], 2);
  EXPECT_EQ(lines[2]["result"]["stdout"], "after\n") << lines[2].dump();

  auto help = cli({"repl", "--help"});
  EXPECT_NE(help.out.find("16 MiB"), std::string::npos) << help.out;
}

// 300 requests written at once: with an LM handler the repl stops reading while 256 wait, and
// all are done; without one (the orchestrator must still be heard) those beyond 256 are refused,
// each with one error line naming its id.
TEST(CliReplInput, RequestsBeyondTheQueueWaitWithAnLmHandlerAndAreRefusedWithout) {
  constexpr int kRequests = 300;
  ProcessOptions options;
  options.stdin_data = R"x({"id":0,"op":"execute","code":"import time; time.sleep(2)"})x"
                       "\n";
  for (int id = 1; id < kRequests; ++id)
    options.stdin_data += json({{"id", id}, {"op", "execute"}, {"code", "pass"}}).dump() + "\n";

  auto with_lm = cli({"repl", "--lm", "echo"}, options);
  ASSERT_EQ(with_lm.exit_code, 0) << with_lm.err;
  std::vector<int> done;
  for (const auto& line : lines_of(with_lm.out))
    if (line.contains("result")) done.push_back(line["id"].get<int>());
  EXPECT_EQ(done.size(), std::size_t{kRequests}) << with_lm.out.substr(0, 2000);
  EXPECT_TRUE(error_ids(lines_of(with_lm.out)).empty());

  auto without = cli({"repl"}, options);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  std::vector<bool> answered(kRequests, false);
  std::size_t refused = 0;
  for (const auto& line : lines_of(without.out)) {
    if (!line.contains("id")) continue;  // ready
    const int id = line["id"].get<int>();
    ASSERT_GE(id, 0);
    ASSERT_LT(id, kRequests);
    EXPECT_FALSE(answered[id]) << "two lines for request " << id;
    answered[id] = true;
    if (line.contains("error")) {
      ++refused;
      EXPECT_NE(line["error"].get<std::string>().find("too many requests"), std::string::npos)
          << line.dump();
    }
  }
  EXPECT_EQ(std::count(answered.begin(), answered.end(), true), kRequests);
  EXPECT_GE(refused, std::size_t{kRequests - 1 - 256});
  EXPECT_LE(refused, std::size_t{kRequests - 1 - 255});
}

}  // namespace
}  // namespace rlm::test
