// What the run's cgroup saw, folded into the Result: the memory and pids limits as statuses,
// whole-tree CPU time and peak memory.
#pragma once

#include "namespace/cgroup.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::ns {

// After common::fill_result. A payload that failed (exit_nonzero, signaled, timeout; or init
// itself gone without a report) after the OOM killer struck is memory_limit; after pids.max
// refused a fork it is pids_limit -- a fork bomb usually ends in its own errors or the timeout,
// and the limit is the real cause. peak_memory_bytes and cpu come from the cgroup when it has
// them (the whole tree, where rusage only sees what init reaped).
// `stopped_at_limit`: the runtime stopped the run because the cgroup showed a limit reached, so
// the limit is the outcome even if the payload's main process then exited cleanly.
void apply_cgroup_usage(Result& result, const CgroupUsage& usage, const Limits& limits,
                        bool stopped_at_limit);

}  // namespace rlm::ns
