// What the run's cgroup saw, folded into the Result: the memory, pids and CPU time limits as
// statuses, whole-tree CPU time and peak memory.
#pragma once

#include <chrono>

#include "cgroup/usage.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::ns {

// After common::fill_result. A payload that failed (exit_nonzero, signaled, timeout; or init
// itself gone without a report) after the OOM killer struck is memory_limit; after pids.max
// refused a fork it is pids_limit -- a fork bomb usually ends in its own errors or the timeout,
// and the limit is the real cause. peak_memory_bytes and cpu come from the cgroup when it has
// them (the whole tree, where rusage only sees what init reaped).
// The sandbox's CPU time (the whole group's, every process together) past `cpu_budget` is
// cpu_limit (signal SIGXCPU, as RLIMIT_CPU reports it) when the runtime stopped the run for it, or
// when the payload failed after spending it; unless the wall limit, the output limit, a seccomp
// kill, the OOM killer or a setup failure came first. A payload that finished cleanly within one
// look of the supervision loop after passing the budget stays ok.
// `stopped_at`: the runtime stopped the run because the cgroup showed that limit reached, so the
// limit is the outcome even if the payload's main process then exited cleanly.
enum class CgroupLimit { none, pids, cpu_time };
void apply_cgroup_usage(Result& result, const cgroup::CgroupUsage& usage, const Limits& limits,
                        std::chrono::milliseconds cpu_budget, CgroupLimit stopped_at);

}  // namespace rlm::ns
