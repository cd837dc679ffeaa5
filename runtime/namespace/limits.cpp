#include "namespace/limits.hpp"

#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>

namespace rlm::ns {

bool nproc_rlimit_is_per_user_namespace() {
  static const bool per_namespace = [] {
    utsname name{};
    int major = 0, minor = 0;
    if (::uname(&name) != 0 || std::sscanf(name.release, "%d.%d", &major, &minor) != 2)
      return false;
    return major > 5 || (major == 5 && minor >= 14);
  }();
  return per_namespace;
}

std::vector<supervisor::ResourceLimit> init_rlimits(const Limits& limits, bool have_cgroup) {
  using supervisor::Resource;
  auto rlimits = supervisor::policy_rlimits(limits);
  if (have_cgroup) {
    std::erase_if(rlimits,
                  [](const supervisor::ResourceLimit& r) { return r.resource == Resource::as; });
  } else if (nproc_rlimit_is_per_user_namespace()) {
    rlimits.push_back({Resource::nproc, limits.pids, limits.pids});
  }
  return rlimits;
}

void add_cgroup_account(supervisor::RunEnd& end, const cgroup::CgroupUsage& usage,
                        std::chrono::milliseconds cpu_budget, CgroupLimit stopped_at) {
  end.account = supervisor::GroupAccount::whole_run;
  end.oom_killed = usage.oom_killed;
  end.pids_limit_hit = usage.pids_limit_hit;
  end.group_cpu = usage.cpu;
  end.group_peak_memory = usage.peak_memory_bytes;
  end.cpu_budget = cpu_budget;
  if (stopped_at == CgroupLimit::cpu_time) end.stop = supervisor::Stop::cpu_time;
  if (stopped_at == CgroupLimit::pids) end.stop = supervisor::Stop::pids;
}

std::vector<LimitFallback> cgroup_limit_fallbacks() {
  std::vector<LimitFallback> out;
  out.push_back({"limits.memory_bytes", false,
                 "RLIMIT_AS (address space per process): an allocation beyond it fails in the "
                 "payload instead of the run ending memory_limit; memory that is reserved but "
                 "unused counts, and there is no peak memory"});
  if (nproc_rlimit_is_per_user_namespace()) {
    out.push_back({"limits.pids", true,
                   "RLIMIT_NPROC of the sandbox user in the sandbox's own user namespace (Linux "
                   "5.14+ counts it per namespace): forks beyond it fail with EAGAIN; the run "
                   "does not end pids_limit"});
  } else {
    out.push_back({"limits.pids", false,
                   "not enforced: before Linux 5.14 RLIMIT_NPROC counts every process of the host "
                   "uid, across sandboxes"});
  }
  out.push_back({"limits.cpu_time_ms", false,
                 "RLIMIT_CPU per process: each process may use the whole budget, so a chain of "
                 "short-lived processes is not bounded as a sandbox"});
  out.push_back({"limits.cpus", false, "not enforced: no cgroup to hold a CPU bandwidth limit"});
  return out;
}

void note_limit_fallbacks(Result& result, const std::string& why, const Limits& limits) {
  std::string note = "note: no cgroup (" + why + "); in its place";
  for (const auto& fallback : cgroup_limit_fallbacks()) {
    if (fallback.field == "limits.cpus" && !limits.cpus) continue;  // nothing was asked for
    if (!fallback.enforced) result.unenforced.push_back(fallback.field);
    note += ", " + fallback.field + ": " + fallback.how;
  }
  supervisor::add_note(result, note);
}

void note_cpu_time_per_process(Result& result) {
  result.unenforced.push_back("limits.cpu_time_ms");
  supervisor::add_note(result,
                       "note: the run's cgroup counts no CPU time (no cpuacct hierarchy), so "
                       "limits.cpu_time_ms bounded each process (RLIMIT_CPU), not the sandbox");
}

void note_cpu_bandwidth_missing(Result& result, const std::string& why) {
  result.unenforced.push_back("limits.cpus");
  supervisor::add_note(result, "note: limits.cpus was not enforced: " + why);
}

}  // namespace rlm::ns
