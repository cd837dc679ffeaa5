// Finding the rlm-sandbox-init binary every init-launching backend execs.
#pragma once

#include <string>
#include <vector>

namespace rlm::common {

struct InitLocation {
  std::string path;                // "" when none was found
  std::vector<std::string> tried;  // every place looked, in order
  // "rlm-sandbox-init not found (looked in ...)" when path is empty.
  std::string problem() const;
  // The step that fixes a missing init.
  static std::string fix();
};

// In order: $RLM_SANDBOX_INIT (when set it is the only candidate: an explicit setting that points
// nowhere is an error, not a hint); next to the running executable; ../libexec/rlm-sandbox/ next
// to it (a relocated install); the configured install path; this build tree.
InitLocation locate_init();

}  // namespace rlm::common
