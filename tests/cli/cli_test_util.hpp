// Helpers for tests that drive the rlm-sandbox binary the way a user or a script does.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "support/subprocess.hpp"

namespace rlm::test {

inline ProcessOutcome cli(std::vector<std::string> args, const ProcessOptions& options = {}) {
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  return run_process(args, options);
}

// The CLI printed exactly one line on stderr (a message a person can act on, not a dump).
inline bool one_line(const std::string& text) {
  return !text.empty() && text.find('\n') == text.size() - 1;
}

}  // namespace rlm::test
