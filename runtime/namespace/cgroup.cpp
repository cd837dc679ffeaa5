// Picks v2 or v1 for this host, and reports what it found for `health`.
#include "namespace/cgroup.hpp"

#include <sys/statvfs.h>

#include "namespace/cgroup_impl.hpp"

namespace rlm::ns {
namespace {

struct Attempt {
  std::unique_ptr<GroupDirs> group;
  CgroupSupport::Mode mode = CgroupSupport::Mode::none;
  CgroupFailure failure;
};

// Inside a container that was not given a writable cgroupfs (Docker's default, most Kubernetes
// pods) every write fails with EROFS: say that, rather than suggest a delegation that cannot help.
void explain_read_only(const HostCgroups& host, CgroupFailure& failure) {
  std::string mount;
  if (host.v2) {
    mount = host.v2->mount_point;
  } else if (!host.v1_memory.empty()) {
    mount = host.v1_memory;
  } else {
    return;
  }
  struct statvfs fs {};
  if (::statvfs(mount.c_str(), &fs) != 0 || (fs.f_flag & ST_RDONLY) == 0) return;
  failure.why += " (" + mount + " is mounted read-only)";
  failure.fix =
      "the cgroup filesystem is read-only here, as in a container that was not given a writable "
      "one: give the container a writable, delegated cgroup (Docker: --privileged, or "
      "--cgroupns=private with a writable /sys/fs/cgroup; Kubernetes: a privileged container), "
      "or run rlm-sandbox on the host; until then rlimits stand in (see docs/cgroups.md)";
}

Attempt attempt(const Limits& limits) {
  Attempt a;
  const HostCgroups host = detect_host_cgroups();
  if (host.v2) {
    a.mode = CgroupSupport::Mode::v2;
    a.group = create_v2(host, limits, a.failure);
  } else if (!host.v1_memory.empty() || !host.v1_pids.empty()) {
    a.mode = CgroupSupport::Mode::v1;
    a.group = create_v1(host, limits, a.failure);
  } else {
    a.failure.why = "no cgroup hierarchy with the memory and pids controllers is mounted";
    if (!host.note.empty()) a.failure.why += " (" + host.note + ")";
    a.failure.fix =
        "mount cgroup2 at /sys/fs/cgroup with the memory and pids controllers "
        "(see docs/cgroups.md)";
  }
  if (!a.group) {
    a.mode = CgroupSupport::Mode::none;
    explain_read_only(host, a.failure);
  }
  return a;
}

}  // namespace

std::unique_ptr<RunCgroup> RunCgroup::create(const Limits& limits, std::string* why) {
  Attempt a = attempt(limits);
  if (!a.group && why != nullptr) {
    *why = a.failure.why;
    if (!a.failure.fix.empty()) *why += "; to fix: " + a.failure.fix;
  }
  return std::move(a.group);
}

CgroupSupport probe_cgroups() {
  // The honest test is the real thing: make a group with default limits and a CPU bandwidth, and
  // remove it.
  Limits limits;
  limits.cpus = 1;
  Attempt a = attempt(limits);
  CgroupSupport s;
  s.mode = a.mode;
  if (a.group) {
    // Name the parents, not the throw-away probe group.
    std::string parents;
    for (const auto& dir : a.group->dirs()) {
      s.parents.push_back(dir.substr(0, dir.rfind('/')));
      parents += (parents.empty() ? "" : ", ") + s.parents.back();
    }
    s.enforced = {"limits.memory_bytes", "limits.pids"};
    bool cpu_time = false, cpus = false;
    if (a.group->cpu_time()) {
      s.enforced.push_back("limits.cpu_time_ms");
      cpu_time = true;
    } else {
      s.missing["limits.cpu_time_ms"] =
          "no CPU accounting in the run's cgroup (no cpuacct hierarchy): RLIMIT_CPU bounds each "
          "process, not the sandbox";
    }
    if (a.group->cpu_bandwidth_limited()) {
      s.enforced.push_back("limits.cpus");
      cpus = true;
    } else {
      s.missing["limits.cpus"] = "not enforced: " + a.group->cpu_bandwidth_problem();
    }
    const std::string what = std::string("memory, pids") +
                             (cpu_time ? ", sandbox-wide CPU time" : "") +
                             (cpus ? ", CPU bandwidth" : "") + " limits";
    s.detail = std::string(a.mode == CgroupSupport::Mode::v2 ? "cgroup v2" : "cgroup v1") + ": " +
               what + " in groups under " + parents;
  } else {
    s.detail = a.failure.why;
    s.fix = a.failure.fix;
  }
  return s;
}

}  // namespace rlm::ns
