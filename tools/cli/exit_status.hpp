// The rlm-sandbox CLI's exit statuses. DESIGN.md §8: they are a contract with scripts; never change
// them silently. Header-only, so the tests that check what a Result comes to include it alone.
#pragma once

#include "rlm_sandbox/result.hpp"

namespace rlm::cli {

inline constexpr int kExitUsage = 2;          // unknown flag, missing argument
inline constexpr int kExitPolicyInvalid = 1;  // `policy check` found problems
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitSetup = 125;  // the sandbox could not be set up; stderr says why

// `run`'s exit status for a result: 0; the payload's code; 128+N for signal N; 124 for a timeout;
// 125 when the sandbox could not be set up.
inline int exit_status(const Result& result) {
  switch (result.status) {
    case Status::ok:
      return 0;
    case Status::timeout:
      return kExitTimeout;
    case Status::sandbox_error:
      return kExitSetup;
    default:
      break;
  }
  if (result.signal > 0) return 128 + result.signal;
  if (result.exit_code >= 0) return result.exit_code;
  return kExitSetup;
}

}  // namespace rlm::cli
