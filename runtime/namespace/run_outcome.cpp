#include "namespace/run_outcome.hpp"

#include <signal.h>

#include "rlm_sandbox/units.hpp"

namespace rlm::ns {
namespace {

bool failed(Status status) {
  return status == Status::exit_nonzero || status == Status::signaled ||
         status == Status::timeout || status == Status::sandbox_error;
}

}  // namespace

void apply_cgroup_usage(Result& result, const cgroup::CgroupUsage& usage, const Limits& limits,
                        std::chrono::milliseconds cpu_budget, CgroupLimit stopped_at) {
  if (usage.peak_memory_bytes) result.peak_memory_bytes = *usage.peak_memory_bytes;
  if (usage.cpu) result.cpu = *usage.cpu;
  // Over budget between two looks of the supervision loop, a payload may still end by itself.
  const bool cpu_spent = usage.cpu && *usage.cpu >= cpu_budget;
  if (usage.oom_killed && failed(result.status)) {
    result.status = Status::memory_limit;
    result.detail = "memory limit " + format_size(limits.memory_bytes) +
                    " exceeded (limits.memory_bytes): the kernel's OOM killer stopped a process "
                    "of the sandbox";
  } else if (cpu_spent &&
             (stopped_at == CgroupLimit::cpu_time || result.status == Status::exit_nonzero ||
              result.status == Status::signaled || result.status == Status::cpu_limit)) {
    if (stopped_at == CgroupLimit::cpu_time) {
      // Init stopped the tree on our word: reported as the SIGXCPU death RLIMIT_CPU gives a single
      // process (exit status 152 from the CLI), whatever signal the payload's processes saw.
      result.exit_code = -1;
      result.signal = SIGXCPU;
    }
    result.status = Status::cpu_limit;
    result.detail =
        "CPU time limit " + format_duration(cpu_budget) +
        " exceeded (limits.cpu_time_ms): the sandbox's processes together used " +
        format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(*usage.cpu)) +
        " of CPU time";
  } else if (usage.pids_limit_hit &&
             (stopped_at == CgroupLimit::pids ||
              (failed(result.status) && result.status != Status::sandbox_error))) {
    result.status = Status::pids_limit;
    result.detail = "process limit " + std::to_string(limits.pids) +
                    " reached (limits.pids): the sandbox could not create more processes";
  }
}

}  // namespace rlm::ns
