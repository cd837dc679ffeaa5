#include "namespace/limit_fallback.hpp"

#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>

#include "local/rlimits.hpp"

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

std::vector<std::string> init_rlimits(const Limits& limits, bool have_cgroup) {
  auto rlimits = local::rlimit_arguments(limits);
  if (have_cgroup) {
    std::erase_if(rlimits, [](const std::string& r) { return r.starts_with("as="); });
  } else if (nproc_rlimit_is_per_user_namespace()) {
    const std::string pids = std::to_string(limits.pids);
    rlimits.push_back("nproc=" + pids + ":" + pids);
  }
  return rlimits;
}

void note_limit_fallbacks(Result& result, const std::string& why, const Limits& limits) {
  std::string note = "note: no cgroup (" + why + "); in its place";
  for (const auto& fallback : cgroup_limit_fallbacks()) {
    if (fallback.field == "limits.cpus" && !limits.cpus) continue;  // nothing was asked for
    if (!fallback.enforced) result.unenforced.push_back(fallback.field);
    note += ", " + fallback.field + ": " + fallback.how;
  }
  result.detail += (result.detail.empty() ? "" : "; ") + note;
}

void note_cpu_time_per_process(Result& result) {
  result.unenforced.push_back("limits.cpu_time_ms");
  result.detail += std::string(result.detail.empty() ? "" : "; ") +
                   "note: the run's cgroup counts no CPU time (no cpuacct hierarchy), so "
                   "limits.cpu_time_ms bounded each process (RLIMIT_CPU), not the sandbox";
}

void note_cpu_bandwidth_missing(Result& result, const std::string& why) {
  result.unenforced.push_back("limits.cpus");
  result.detail +=
      std::string(result.detail.empty() ? "" : "; ") + "note: limits.cpus was not enforced: " + why;
}

}  // namespace rlm::ns
