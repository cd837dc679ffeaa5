// The LM handlers linked with the static CLI's HTTP stub: http: fails when the handler is made,
// before any session starts, so the CLI can re-execute its dynamically linked sibling.
#include <gtest/gtest.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"

namespace rlm::test {
namespace {

TEST(BrokerStub, HttpHandlerThrowsNeedsFullBinaryWhenMade) {
  EXPECT_THROW(make_llm_handler("http:https://api.openai.com/v1/chat/completions"),
               NeedsFullBinary);
  // A bare URL is the http: handler too (repl --help's example), not an unknown handler.
  EXPECT_THROW(make_llm_handler("http://localhost:8000/v1/chat/completions"), NeedsFullBinary);
}

TEST(BrokerStub, OtherHandlersWork) {
  EXPECT_NE(make_llm_handler("echo"), nullptr);
  EXPECT_NE(make_llm_handler("command:cat"), nullptr);
}

}  // namespace
}  // namespace rlm::test
