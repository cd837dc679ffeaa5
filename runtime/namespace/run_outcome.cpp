#include "namespace/run_outcome.hpp"

#include "rlm_sandbox/units.hpp"

namespace rlm::ns {
namespace {

bool failed(Status status) {
  return status == Status::exit_nonzero || status == Status::signaled ||
         status == Status::timeout || status == Status::sandbox_error;
}

}  // namespace

void apply_cgroup_usage(Result& result, const CgroupUsage& usage, const Limits& limits,
                        bool stopped_at_limit) {
  if (usage.peak_memory_bytes) result.peak_memory_bytes = *usage.peak_memory_bytes;
  if (usage.cpu) result.cpu = *usage.cpu;
  if (usage.oom_killed && failed(result.status)) {
    result.status = Status::memory_limit;
    result.detail = "memory limit " + format_size(limits.memory_bytes) +
                    " exceeded (limits.memory_bytes): the kernel's OOM killer stopped a process "
                    "of the sandbox";
  } else if (usage.pids_limit_hit &&
             (stopped_at_limit ||
              (failed(result.status) && result.status != Status::sandbox_error))) {
    result.status = Status::pids_limit;
    result.detail = "process limit " + std::to_string(limits.pids) +
                    " reached (limits.pids): the sandbox could not create more processes";
  }
}

}  // namespace rlm::ns
