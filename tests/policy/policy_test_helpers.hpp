// Shared by the policy tests: load a document and collect what went wrong.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "support/scoped_env.hpp"

namespace rlm::test {

// Every diagnostic load_policy_text reports for `text` (empty when it loads).
inline std::vector<Diagnostic> problems_in(const std::string& text,
                                           const std::string& base_dir = ".") {
  try {
    load_policy_text(text, "test.json", base_dir);
    return {};
  } catch (const PolicyError& error) {
    return error.diagnostics();
  }
}

// The one diagnostic for `text`; fails the test when there is not exactly one.
inline Diagnostic only_problem_in(const std::string& text) {
  const auto found = problems_in(text);
  if (found.size() == 1) return found.front();
  std::string listed;
  for (const auto& d : found) listed += "\n  " + d.to_string();
  ADD_FAILURE() << "expected exactly one diagnostic for " << text << ", got " << found.size()
                << listed;
  return {};
}

}  // namespace rlm::test
