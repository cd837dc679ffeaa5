// The namespace backend's limits beyond what the cgroup module writes: rlm-sandbox-init's rlimits
// for a run, what the run's cgroup saw (for the RunEnd the Result is classified from), and, when
// this host gives the runtime no usable cgroup (an ordinary user without a delegated subtree, a
// container with a read-only cgroupfs), what stands in for the cgroup limits, with an honest
// account of what it does not cover, for `health` and for the Result.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "cgroup/usage.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/rlimits.hpp"

namespace rlm::ns {

// ---- Init's rlimits ---------------------------------------------------------------------------

// Since Linux 5.14 RLIMIT_NPROC is counted per (user namespace, uid): in the sandbox's own user
// namespace it bounds that sandbox's processes alone. Before, it counted every process of the
// host uid, across sandboxes and the user's own session.
bool nproc_rlimit_is_per_user_namespace();

// rlm-sandbox-init's rlimits for a run: the policy's, with RLIMIT_AS only when no cgroup limits
// memory (address space is a poor proxy: runtimes reserve far more than they use), and
// RLIMIT_NPROC for limits.pids when no cgroup does and the kernel counts it per namespace.
std::vector<supervisor::ResourceLimit> init_rlimits(const Limits& limits, bool have_cgroup);

// ---- The cgroup's account ---------------------------------------------------------------------

// Which of the cgroup's limits the runtime stopped the run for.
enum class CgroupLimit { none, pids, cpu_time };

// Puts what the run's cgroup saw into `end` (a whole-run account: supervisor/outcome.hpp): the OOM
// killer, a refused fork, the whole tree's CPU time against `cpu_budget` and its peak memory.
// `stopped_at`: the runtime stopped the run because the cgroup showed that limit reached.
void add_cgroup_account(supervisor::RunEnd& end, const cgroup::CgroupUsage& usage,
                        std::chrono::milliseconds cpu_budget, CgroupLimit stopped_at);

// ---- Without a cgroup -------------------------------------------------------------------------

struct LimitFallback {
  std::string field;  // "limits.memory_bytes"
  bool enforced;      // whether the stand-in really bounds what the field promises
  std::string how;    // what enforces it instead, and what is lost
};

// One entry per cgroup-backed policy field (memory, pids, CPU time, CPU bandwidth).
std::vector<LimitFallback> cgroup_limit_fallbacks();

// For a run without a cgroup: lists the limits that did not hold in `result.unenforced`
// (limits.cpus only when `limits` set one) and says in `result.detail` what stood in and why there
// was no cgroup (`why`).
void note_limit_fallbacks(Result& result, const std::string& why, const Limits& limits);

// For a run whose cgroup counts no CPU time (a v1 host without the cpuacct hierarchy): lists
// limits.cpu_time_ms in `result.unenforced`; RLIMIT_CPU bounded each process instead.
void note_cpu_time_per_process(Result& result);

// For a run whose cgroup could not give the CPU bandwidth `limits` asked for (`why`): lists
// limits.cpus in `result.unenforced` and says so in `result.detail`.
void note_cpu_bandwidth_missing(Result& result, const std::string& why);

}  // namespace rlm::ns
