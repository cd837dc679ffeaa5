// docs/policy.md stays true: its complete example documents load, and its tables name every
// shipped policy.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm {
namespace {

std::string read_docs() {
  std::ifstream file(test::source_path("docs/policy.md"));
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The ```json blocks that are whole documents (fragments such as "seccomp": {...} are skipped).
std::vector<std::string> example_documents(const std::string& markdown) {
  std::vector<std::string> documents;
  const std::string open = "```json\n", close = "```";
  for (auto start = markdown.find(open); start != std::string::npos;
       start = markdown.find(open, start)) {
    start += open.size();
    const auto end = markdown.find(close, start);
    const std::string block = markdown.substr(start, end - start);
    if (block.starts_with("{")) documents.push_back(block);
    start = end + close.size();
  }
  return documents;
}

TEST(PolicyDocs, ExampleDocumentsAreValid) {
  const auto documents = example_documents(read_docs());
  ASSERT_FALSE(documents.empty());
  for (const auto& document : documents) {
    try {
      load_policy_text(document, "docs/policy.md");
    } catch (const PolicyError& error) {
      ADD_FAILURE() << error.what() << "\nin:\n" << document;
    }
  }
}

TEST(PolicyDocs, NameEveryShippedPolicyAndTheStrictDenyCount) {
  const auto markdown = read_docs();
  for (const auto& name : shipped_policy_names())
    EXPECT_NE(markdown.find("**" + name + "**"), std::string::npos) << name;
  const auto& rules = load_policy("strict").seccomp.syscalls;
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_NE(markdown.find("EPERM for " + std::to_string(rules[0].names.size()) + " syscalls"),
            std::string::npos);
}

}  // namespace
}  // namespace rlm
