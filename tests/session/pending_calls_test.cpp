// The table of LM calls answered elsewhere (session/pending_calls.hpp), shared by the repl's
// orchestrator and the server's client: ids, answers that fit or not, closing.
#include "session/pending_calls.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

namespace rlm::session {
namespace {

LlmCall call_of(CallKind kind) {
  LlmCall call;
  call.kind = kind;
  return call;
}

TEST(PendingCalls, EachCallGetsAnIdAndItsAnswerCompletesItOnce) {
  PendingCalls calls("gone");
  std::vector<std::string> answers;
  const auto first =
      calls.add(call_of(CallKind::llm), [&](LlmAnswer a) { answers.push_back(*a.text); });
  const auto second =
      calls.add(call_of(CallKind::llm), [&](LlmAnswer a) { answers.push_back(*a.text); });
  ASSERT_TRUE(first && second);
  EXPECT_NE(*first, *second);
  EXPECT_TRUE(calls.complete(*second, LlmAnswer::of_text("two")));
  EXPECT_FALSE(calls.complete(*second, LlmAnswer::of_text("again")));
  EXPECT_TRUE(calls.complete(*first, LlmAnswer::of_text("one")));
  EXPECT_EQ(answers, (std::vector<std::string>{"two", "one"}));
}

TEST(PendingCalls, AnAnswerThatDoesNotFitLeavesTheCallWaiting) {
  PendingCalls calls("gone");
  std::optional<LlmAnswer> got;
  const auto id = calls.add(call_of(CallKind::tool), [&](LlmAnswer a) { got = std::move(a); });
  ASSERT_TRUE(id);
  bool saw_tool = false;
  EXPECT_TRUE(calls.complete(*id, [&](bool tool) -> std::optional<LlmAnswer> {
    saw_tool = tool;
    return std::nullopt;
  }));
  EXPECT_TRUE(saw_tool);
  EXPECT_FALSE(got);
  EXPECT_TRUE(calls.complete(*id, LlmAnswer::of_text("[]")));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->text, "[]");
}

TEST(PendingCalls, ClosingFailsOpenAndLaterCallsAndACancelledCallIsRefused) {
  PendingCalls calls("the other side is gone");
  std::vector<std::string> errors;
  const auto record = [&](LlmAnswer a) { errors.push_back(a.error); };
  ASSERT_TRUE(calls.add(call_of(CallKind::llm), record));

  LlmCall cancelled = call_of(CallKind::llm);
  cancelled.cancelled = std::make_shared<std::atomic<bool>>(true);
  EXPECT_FALSE(calls.add(cancelled, record));

  calls.close();
  EXPECT_FALSE(calls.add(call_of(CallKind::llm), record));
  EXPECT_EQ(errors, (std::vector<std::string>{"the cell that asked has ended",
                                              "the other side is gone", "the other side is gone"}));
}

}  // namespace
}  // namespace rlm::session
