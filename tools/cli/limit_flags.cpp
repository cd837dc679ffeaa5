#include "limit_flags.hpp"

#include <string>
#include <string_view>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm::cli {
namespace {

// Throws when `requested` is zero or looser than `allowed`; `flag` and `field` name it for the
// user.
template <typename Value, typename Format>
void check_override(const std::optional<Value>& requested, const Value& allowed,
                    std::string_view flag, std::string_view field, Format format) {
  if (!requested) return;
  if (*requested <= Value{}) throw Error(std::string(flag) + " must be greater than 0");
  if (*requested > allowed)
    throw Error(std::string(flag) + " " + format(*requested) + " exceeds the policy's " +
                std::string(field) + " (" + format(allowed) +
                "); a run may only tighten its policy");
}

}  // namespace

void tighten(Policy& policy, const LimitOverrides& overrides) {
  Limits& limits = policy.limits;
  const auto duration = [](std::chrono::milliseconds value) { return format_duration(value); };
  const auto size = [](std::uint64_t value) { return format_size(value); };
  const auto count = [](std::uint32_t value) { return std::to_string(value); };
  check_override(overrides.wall_time, limits.wall_time, "--timeout", "limits.wall_time_ms",
                 duration);
  check_override(overrides.cpu_time, limits.cpu_time, "--cpu-time", "limits.cpu_time_ms", duration);
  check_override(overrides.memory_bytes, limits.memory_bytes, "--memory", "limits.memory_bytes",
                 size);
  check_override(overrides.pids, limits.pids, "--pids", "limits.pids", count);
  if (overrides.cpus) {
    const double cpus = *overrides.cpus;
    if (!(cpus >= kMinCpus && cpus <= kMaxCpus))
      throw Error("--cpus " + format_cpus(cpus) + " must be between " + format_cpus(kMinCpus) +
                  " and " + format_cpus(kMaxCpus));
    // A policy without a bandwidth limit may be given any.
    if (limits.cpus && cpus > *limits.cpus)
      throw Error("--cpus " + format_cpus(cpus) + " exceeds the policy's limits.cpus (" +
                  format_cpus(*limits.cpus) + "); a run may only tighten its policy");
  }

  if (overrides.wall_time) limits.wall_time = *overrides.wall_time;
  if (overrides.cpu_time) limits.cpu_time = *overrides.cpu_time;
  if (overrides.memory_bytes) limits.memory_bytes = *overrides.memory_bytes;
  if (overrides.pids) limits.pids = *overrides.pids;
  if (overrides.cpus) limits.cpus = *overrides.cpus;
}

}  // namespace rlm::cli
