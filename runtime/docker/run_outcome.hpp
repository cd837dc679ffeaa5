// From what the stream, the daemon and the stats said to the Result every backend returns, with the
// same status taxonomy as runtime/common/outcome.hpp.
//
// Docker reports a payload killed by signal N as exit status 128+N (its init does the same for its
// child), so 128+N for N in 1..64 is read as that signal: SIGXCPU, or SIGKILL once the CPU budget
// is spent, is cpu_limit; SIGSYS is seccomp_violation; SIGKILL with the kernel's OOM kill in the
// container is memory_limit; another is signaled. A payload that itself exits with 130 is
// indistinguishable from one killed by SIGINT.
#pragma once

#include <chrono>
#include <optional>

#include "docker/attached_stream.hpp"
#include "docker/stats_sampler.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::docker {

struct Termination {
  std::optional<int> exit_code;     // as Docker reports it; nullopt when it could not say
  bool oom_killed = false;          // the kernel's OOM killer struck in the container
  bool stopped_by_another = false;  // a session container stopped over another execution's limit
  // The container's CPU time budget (StreamEnd::cpu_limit says it was spent); 0: the policy's.
  std::chrono::milliseconds cpu_budget{0};
};

// Fills status, exit_code, signal, detail, the output and its truncation flags, cpu and
// peak_memory_bytes. Leaves wall, backend and policy to the caller.
void fill_result(Result& result, StreamOutcome stream, const Termination& termination,
                 const CgroupReading& usage, const Policy& policy,
                 std::chrono::milliseconds wall_limit);

}  // namespace rlm::docker
