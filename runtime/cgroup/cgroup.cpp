// The module's entry points: a run's group (v2 or v1, whichever this host has) and its teardown,
// shared by both; the probe behind `health`; and the collection of groups left by dead owners.
#include "cgroup/cgroup.hpp"

#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "cgroup/files.hpp"
#include "cgroup/group.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::cgroup {
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
  // On v1 a cgroup namespace gives no writable hierarchy; binding the host's hierarchies writable
  // does (rlm-sandbox then makes its groups under the container's own; checked on a v1 host).
  const std::string how =
      host.v2 ? "Docker: --privileged, or --cgroupns=private with a writable /sys/fs/cgroup; "
                "Kubernetes: a privileged container"
              : "cgroup v1 here, where --cgroupns=private does not make it writable: Docker: -v "
                "/sys/fs/cgroup:/sys/fs/cgroup:rw (the host's hierarchies, writable: whoever is "
                "root in the container can then change any group of the host), or --privileged; "
                "Kubernetes: a privileged container";
  failure.fix =
      "the cgroup filesystem is read-only here, as in a container that was not given a writable "
      "one: give the container a writable, delegated cgroup (" +
      how + "), or run rlm-sandbox on the host; until then rlimits stand in (see docs/cgroups.md)";
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

CreatedCgroup RunCgroup::create(const Limits& limits) {
  Attempt a = attempt(limits);
  CreatedCgroup created;
  if (!a.group) {
    created.problem = a.failure.why;
    if (!a.failure.fix.empty()) created.problem += "; to fix: " + a.failure.fix;
  }
  created.group = std::move(a.group);
  return created;
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

// What v1 and v2 groups share: teardown (kill every member, then rmdir; bounded and
// exception-free), attaching, the CFS quota.
GroupDirs::GroupDirs(const RunId& id, std::vector<std::string> dirs, UsageReader reader)
    : suffix_(std::string("/") + kParentName + "/" + id.to_string()),
      dirs_(std::move(dirs)),
      reader_(std::move(reader)) {
  // Built ahead of its run, the group's Result then reads its counters with one pread each.
  reader_.open_counters();
}

GroupDirs::~GroupDirs() {
  reader_.close_counters();  // nothing of the group held open while it is removed
  try {
    cgfs::kill_until_empty(dirs_, suffix_, kKillTimeout);
    for (const auto& dir : dirs_) {
      if (!cgfs::remove_group(dir, suffix_, kRemoveTimeout)) continue;
      // The rlm-sandbox parent goes too once no other run uses it, so nothing outlives the last
      // run. ENOTEMPTY/EBUSY mean another run is in it; creators retry if it vanishes under them.
      const std::string parent = dir.substr(0, dir.rfind('/'));
      if (parent.ends_with(std::string("/") + kParentName)) ::rmdir(parent.c_str());
    }
  } catch (...) {
    // Only allocation can throw here; a group left behind is collected as stale later.
  }
}

void GroupDirs::kill_all() {
  cgfs::kill_until_empty(dirs_, suffix_, kKillTimeout);
}

bool GroupDirs::empty() const {
  for (const auto& dir : dirs_)
    if (!cgfs::members(dir).empty()) return false;
  return true;
}

bool GroupDirs::begin_next_run() {
  return reader_.begin_next_run();
}

std::uint64_t cpu_quota_us(double cpus) {
  // The kernel's smallest quota is 1 ms (kMinCpus of the 100 ms period).
  const double quota = std::round(cpus * static_cast<double>(kCpuPeriodUs));
  return static_cast<std::uint64_t>(std::max(quota, 1000.0));
}

void GroupDirs::attach_all(pid_t pid) {
  const std::string text = std::to_string(pid);
  for (const auto& dir : dirs_) {
    if (int err = cgfs::write_file(dir + "/cgroup.procs", text)) {
      throw Error("cannot move process " + text + " into cgroup " + dir + ": " +
                  sys::errno_text(err));
    }
  }
}

// Stale-group collection: a runtime killed mid-run (SIGKILL, OOM, power cut of the process) leaves
// its groups behind, maybe with payload processes in them. Only directories directly inside an
// "rlm-sandbox" parent whose name parses as a run id (run_id.hpp) of a dead owner in our PID
// namespace are touched; everything else on the host is left alone.
namespace {

std::vector<std::string> parent_dirs() {
  const HostCgroups host = detect_host_cgroups();
  std::vector<std::string> out = v2_parent_dirs(host);
  for (const std::string* h : {&host.v1_memory, &host.v1_pids, &host.v1_cpuacct, &host.v1_cpu}) {
    if (h->empty()) continue;
    std::string dir = *h + "/" + kParentName;
    if (!cgfs::contains(out, dir)) out.push_back(dir);
  }
  return out;
}

std::vector<std::string> stale_names(const std::string& parent) {
  std::vector<std::string> out;
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return out;  // no such parent: nothing was ever made there
  while (dirent* e = ::readdir(d)) {
    if (e->d_type != DT_DIR) continue;
    auto id = parse_run_id(e->d_name);
    if (id && owner_state(*id) == Owner::dead) out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

}  // namespace

void collect_stale_groups() {
  try {
    for (const auto& parent : parent_dirs()) {
      for (const auto& name : stale_names(parent)) {
        // Another collector may be removing the same group: ENOENT counts as done, and a group
        // still busy after the timeout is left for the next collection.
        cgfs::remove_group(parent + "/" + name, std::string("/") + kParentName + "/" + name,
                           kRemoveTimeout);
      }
    }
  } catch (...) {
    // Best effort by design (allocation failure only): never fail a run over old leftovers.
  }
}

}  // namespace rlm::cgroup
