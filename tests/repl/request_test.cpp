// parse_repl_request and LineSplitter without a session: every field's type and range, the depth
// and length bounds, and what an error may quote of the line.
#include "repl/request.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rlm::repl {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

ReplInputLimits limits() {
  ReplInputLimits limits;
  limits.max_timeout = 30s;
  return limits;
}

ReplRequest request_of(const std::string& line) {
  auto parsed = parse_repl_request(line, limits());
  if (auto* error = std::get_if<ReplRequestError>(&parsed)) {
    ADD_FAILURE() << line << ": " << error->message;
    return {};
  }
  return std::get<ReplRequest>(parsed);
}

ReplRequestError error_of(const std::string& line, const ReplInputLimits& with = limits()) {
  auto parsed = parse_repl_request(line, with);
  if (!std::holds_alternative<ReplRequestError>(parsed)) {
    ADD_FAILURE() << line.substr(0, 200) << ": taken as a request";
    return {};
  }
  return std::get<ReplRequestError>(parsed);
}

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

TEST(ReplRequest, ValidRequestsKeepTheirFields) {
  auto execute = request_of(R"({"id":1,"op":"execute","code":"x = 1","timeout_ms":30000})");
  EXPECT_EQ(execute.op, ReplOp::execute);
  EXPECT_EQ(execute.id, 1);
  EXPECT_EQ(execute.code, "x = 1");
  EXPECT_EQ(execute.timeout, 30s);
  EXPECT_FALSE(request_of(R"({"op":"execute","code":""})").timeout.has_value());

  auto answer = request_of(R"({"op":"llm_result","query_id":7,"text":"pong"})");
  EXPECT_EQ(answer.op, ReplOp::llm_result);
  EXPECT_EQ(answer.id, nullptr);
  EXPECT_EQ(answer.query_id, 7u);
  EXPECT_EQ(answer.text, "pong");
  EXPECT_FALSE(answer.error.has_value());
  EXPECT_EQ(request_of(R"({"op":"llm_result","query_id":7,"error":"no"})").error, "no");

  EXPECT_EQ(request_of(R"({"id":"s","op":"snapshot"})").id, "s");
  EXPECT_EQ(request_of(R"({"id":-3,"op":"restore","snapshot":2})").snapshot, 2u);
  EXPECT_EQ(request_of(R"({"id":null,"op":"close"})").op, ReplOp::close);
  EXPECT_EQ(request_of(R"({"op":"context","context":{"a":[1,2]}})").context,
            json::parse(R"({"a":[1,2]})"));
  // Nesting up to the bound is fine: the line's object is level 1.
  EXPECT_EQ(request_of(R"({"op":"context","context":)" + nested(63) + "}").op, ReplOp::context);
}

// Issue 13: execute's locals and fetch, a tool's answer as a value, add_context and add_history.
TEST(ReplRequest, TheRlmRequestsKeepTheirFields) {
  auto execute = request_of(R"({"id":1,"op":"execute","code":"","locals":true,"fetch":"x"})");
  EXPECT_TRUE(execute.locals);
  EXPECT_EQ(execute.fetch, "x");
  EXPECT_FALSE(request_of(R"({"op":"execute","code":""})").fetch.has_value());

  auto value = request_of(R"({"op":"llm_result","query_id":3,"value":{"a":[1,null]}})");
  EXPECT_EQ(value.value, json::parse(R"({"a":[1,null]})"));
  EXPECT_FALSE(value.text.has_value());
  EXPECT_EQ(request_of(R"({"op":"llm_result","query_id":3,"value":null})").value, json());

  auto text = request_of(R"({"id":2,"op":"add_context","context":"more","index":4})");
  EXPECT_EQ(text.op, ReplOp::add_context);
  EXPECT_EQ(text.context, "more");
  EXPECT_EQ(text.index, 4u);
  EXPECT_FALSE(text.context_json);
  auto file = request_of(R"({"op":"add_context","context_file":"/tmp/c.json","json":true})");
  EXPECT_EQ(file.context_file, "/tmp/c.json");
  EXPECT_TRUE(file.context_json);
  EXPECT_FALSE(file.index.has_value());
  EXPECT_EQ(request_of(R"({"op":"add_context","context":[1,{"b":2}]})").context,
            json::parse(R"([1,{"b":2}])"));
  auto history = request_of(R"({"op":"add_history","history":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(history.op, ReplOp::add_history);
  EXPECT_EQ(history.context.size(), 1u);
  auto history_file = request_of(R"({"op":"add_history","history_file":"/tmp/h.json"})");
  EXPECT_EQ(history_file.context_file, "/tmp/h.json");
  EXPECT_TRUE(history_file.context_json) << "a history file is JSON text";
}

TEST(ReplRequest, TheRlmRequestsRefuseWrongTypesAndRanges) {
  struct Case {
    std::string line;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"id":1,"op":"execute","code":"","locals":1})", "\"locals\" must be a boolean"},
      {R"({"id":1,"op":"execute","code":"","fetch":1})", "\"fetch\" must be a string"},
      {R"({"id":1,"op":"execute","code":"","fetch":""})", "1 to 1024 bytes"},
      {R"({"id":1,"op":"execute","code":"","fetch":")" + std::string(1025, 'x') + "\"}",
       "1 to 1024 bytes"},
      {R"({"id":1,"op":"llm_result","query_id":1,"text":"a","value":1})", "exactly one"},
      {R"({"id":1,"op":"add_context"})", "exactly one of \"context\""},
      {R"({"id":1,"op":"add_context","context":"a","context_file":"/f"})",
       "exactly one of \"context\""},
      {R"({"id":1,"op":"add_context","context_file":5})", "must be a string (a path)"},
      {R"({"id":1,"op":"add_context","context_file":""})", "is empty"},
      {R"({"id":1,"op":"add_context","context":"a","json":"yes"})", "\"json\" must be a boolean"},
      {R"({"id":1,"op":"add_context","context":"a","index":-1})", "non-negative integer"},
      {R"({"id":1,"op":"add_context","context":"a","index":1.5})", "non-negative integer"},
      {R"({"id":1,"op":"add_context","context":"a","code":""})", "unknown key 'code'"},
      {R"({"id":1,"op":"add_history"})", "needs exactly one of \"history\""},
      {R"({"id":1,"op":"add_history","history":"text"})", "needs exactly one of \"history\""},
      {R"({"id":1,"op":"add_history","history_file":""})", "\"history_file\" is empty"},
      {R"({"id":1,"op":"add_history","history_file":3})", "must be a string (a path)"},
      {R"({"id":1,"op":"add_history","history":[],"json":true})", "unknown key 'json'"},
  };
  for (const auto& [line, says] : cases) {
    const auto error = error_of(line);
    EXPECT_EQ(error.id, 1) << line.substr(0, 100);
    EXPECT_NE(error.message.find(says), std::string::npos)
        << line.substr(0, 100) << " -> " << error.message;
  }
  EXPECT_NE(error_of(R"({"op":"add_context","context":)" + nested(64) + "}")
                .message.find("more than 64 deep"),
            std::string::npos);
  EXPECT_EQ(json_shape_problem("[" + nested(63) + "]", limits()), "");
  EXPECT_NE(json_shape_problem(nested(65), limits()).find("more than 64 deep"), std::string::npos);
}

TEST(ReplRequest, WrongTypesAndRangesAreRefusedWithTheUsableId) {
  struct Case {
    std::string line;
    json id;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"op":1})", nullptr, "\"op\" must be a string"},
      {R"({"id":2})", 2, "needs an \"op\""},
      {R"({"id":"a","op":"explode"})", "a", "unknown op 'explode'"},
      {R"({"id":3,"op":"execute"})", 3, "execute needs \"code\""},
      {R"({"id":3,"op":"execute","code":null})", 3, "execute needs \"code\""},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":1e300})", 4, "from 1 to 30000"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":0})", 4, "from 1 to 30000"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":-1})", 4, "from 1 to 30000"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":30001})", 4, "above the policy's"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":18446744073709551615})", 4,
       "above the policy's"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":2.0})", 4, "from 1 to 30000"},
      {R"({"id":4,"op":"execute","code":"","timeout_ms":null})", 4, "from 1 to 30000"},
      {R"({"id":5,"op":"execute","code":"","timeout":5})", 5, "unknown key 'timeout'"},
      {R"({"id":6,"op":"restore"})", 6, "restore needs \"snapshot\""},
      {R"({"id":6,"op":"restore","snapshot":-1})", 6, "restore needs \"snapshot\""},
      {R"({"id":6,"op":"restore","snapshot":1.0})", 6, "restore needs \"snapshot\""},
      {R"({"id":7,"op":"llm_result","query_id":"1","text":""})", 7, "query_id"},
      {R"({"id":7,"op":"llm_result","query_id":1})", 7, "exactly one"},
      {R"({"id":7,"op":"llm_result","query_id":1,"text":"a","error":"b"})", 7, "exactly one"},
      {R"({"id":7,"op":"llm_result","query_id":1,"text":5})", 7, "\"text\" must be a string"},
      {R"({"id":8,"op":"context"})", 8, "needs \"context\""},
      {R"({"id":1.5,"op":"close"})", nullptr, "id must be"},
      {R"({"id":[1],"op":"close"})", nullptr, "id must be"},
      {R"({"id":{},"op":"close"})", nullptr, "id must be"},
      {R"({"id":false,"op":"close"})", nullptr, "id must be"},
      {R"({"id":")" + std::string(1025, 'x') + R"(","op":"close"})", nullptr, "at most 1024"},
      {"[]", nullptr, "not a JSON object"},
      {"", nullptr, "not a JSON object"},
      {"{", nullptr, "not a JSON object"},
      {"{\"op\":\"close\"} {}", nullptr, "not a JSON object"},
      {"{\"op\":\"close\",\"id\":\"\xc3\x28\"}", nullptr, "not a JSON object"},
  };
  for (const auto& [line, id, says] : cases) {
    const auto error = error_of(line);
    EXPECT_EQ(error.id, id) << line.substr(0, 100);
    EXPECT_NE(error.message.find(says), std::string::npos)
        << line.substr(0, 100) << " -> " << error.message;
  }
}

TEST(ReplRequest, DeepNestingIsRefusedBeforeParsingAndBracketsInStringsDoNotCount) {
  const auto deep_id = error_of(R"({"id":)" + nested(1'000'000) + R"(,"op":"close"})");
  EXPECT_EQ(deep_id.id, nullptr);
  EXPECT_NE(deep_id.message.find("more than 64 deep"), std::string::npos) << deep_id.message;
  EXPECT_EQ(error_of(R"({"op":"context","context":)" + nested(64) + "}").id, nullptr);
  // Unbalanced brackets that are not JSON: still refused, never parsed deep.
  EXPECT_EQ(error_of(std::string(1'000'000, '{')).id, nullptr);
  EXPECT_EQ(error_of(std::string(1'000'000, '[')).id, nullptr);

  const std::string brackets(10'000, '[');
  EXPECT_EQ(request_of(R"({"id":1,"op":"execute","code":")" + brackets + "\"}").code, brackets);
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_EQ(request_of(R"({"op":"execute","code":"\"[[[[\\"})").code, "\"[[[[\\");
}

TEST(ReplRequest, ALineWithTooManyValuesIsRefusedBeforeParsing) {
  std::string many = R"({"op":"context","context":[)";
  for (std::size_t i = 0; i < kMaxReplLineValues; ++i) many += "{},";
  many += "{}]}";
  const auto error = error_of(many);
  EXPECT_EQ(error.id, nullptr);
  EXPECT_NE(error.message.find("more than 262144 JSON values"), std::string::npos) << error.message;
  // Commas in strings do not count.
  EXPECT_EQ(request_of(R"({"op":"execute","code":")" + std::string(1'000'000, ',') + "\"}").op,
            ReplOp::execute);
}

TEST(ReplRequest, MessagesQuoteOnlyAShortPrefixOfTheLine) {
  const std::string huge(1 << 20, 'z');
  for (const auto& line :
       {R"({"op":")" + huge + "\"}", R"({"op":"close",")" + huge + "\":1}", "x" + huge}) {
    const auto error = error_of(line);
    EXPECT_LT(error.message.size(), 300u) << error.message.substr(0, 300);
  }
}

TEST(ReplRequest, ALineOverTheBoundIsRefusedWhole) {
  auto small = limits();
  small.max_line_bytes = 16;
  const auto error = error_of(R"({"op":"close","id":12345})", small);
  EXPECT_EQ(error.id, nullptr);
  EXPECT_NE(error.message.find("longer than 16 bytes"), std::string::npos) << error.message;
}

TEST(ReplRequest, LineSplitterNeverHoldsMoreThanTheBound) {
  LineSplitter splitter(8);
  std::vector<std::string> lines;
  const auto collect = [&](std::string_view line, bool overlong) {
    lines.push_back(overlong ? "<overlong>" : std::string(line));
  };
  splitter.feed("ab", collect);
  splitter.feed("c\n12345678\n", collect);
  splitter.feed("123456789", collect);  // over the bound before its newline arrives
  splitter.feed(std::string(1000, 'x'), collect);
  splitter.feed("\n\nlast", collect);
  splitter.finish(collect);
  splitter.feed("0123456789", collect);
  splitter.finish(collect);
  EXPECT_EQ(lines,
            (std::vector<std::string>{"abc", "12345678", "<overlong>", "", "last", "<overlong>"}));
}

TEST(ReplRequest, BlankLines) {
  EXPECT_TRUE(blank_line(""));
  EXPECT_TRUE(blank_line(" \t\r"));
  EXPECT_FALSE(blank_line(" {} "));
}

}  // namespace
}  // namespace rlm::repl
