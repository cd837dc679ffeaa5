// The limit flags of `run` and `repl` (--timeout, --cpu-time, --memory, --pids, --cpus): a run may
// narrow its policy's limits, never widen them. No Boost and no session, so the unit tests drive
// it alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "rlm_sandbox/policy.hpp"

namespace rlm::cli {

// What the flags asked for; unset: the policy's.
struct LimitOverrides {
  std::optional<std::chrono::milliseconds> wall_time;  // --timeout
  std::optional<std::chrono::milliseconds> cpu_time;   // --cpu-time
  std::optional<std::uint64_t> memory_bytes;           // --memory
  std::optional<std::uint32_t> pids;                   // --pids
  std::optional<double> cpus;                          // --cpus
};

// Applies overrides that tighten; throws Error naming the flag and the policy field when one would
// loosen the policy. All are checked before any is applied, so a rejected call leaves the policy
// untouched.
void tighten(Policy& policy, const LimitOverrides& overrides);

}  // namespace rlm::cli
