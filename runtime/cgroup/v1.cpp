// cgroup v1: one group per hierarchy we use -- memory and pids (required), cpuacct (optional,
// for CPU accounting), cpu (only for limits.cpus: CFS bandwidth) -- at
// <hierarchy>/rlm-sandbox/<run-id>. The hierarchies are found by controller in mountinfo, so
// "cpu,cpuacct" co-mounted and separate mounts both work.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>

#include "cgroup/files.hpp"
#include "cgroup/group.hpp"
#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::cgroup {
namespace {

class V1Cgroup final : public GroupDirs {
 public:
  V1Cgroup(const RunId& id, std::vector<std::string> dirs, std::string memory, std::string pids,
           std::string cpuacct)
      : GroupDirs(id, std::move(dirs), UsageReader::v1(memory, pids, std::move(cpuacct))),
        memory_(std::move(memory)),
        pids_(std::move(pids)) {}

  int clone_into_fd() const override { return -1; }
  void attach(pid_t pid) override { attach_all(pid); }

  std::vector<int> self_join_fds() override {
    if (join_fds_.empty()) {
      for (const auto& dir : dirs()) {
        host::UniqueFd fd(::open((dir + "/tasks").c_str(), O_WRONLY | O_CLOEXEC));
        if (!fd) throw Error("cannot open " + dir + "/tasks: " + sys::errno_text(errno));
        join_fds_.push_back(std::move(fd));
      }
    }
    std::vector<int> fds;
    for (const auto& fd : join_fds_) fds.push_back(fd.get());
    return fds;
  }

  std::string describe() const override {
    std::string out = "cgroup v1";
    for (const auto& d : dirs()) out += " " + d;
    return out;
  }

  // CFS bandwidth: cpu.cfs_quota_us of every cpu.cfs_period_us (the period first: the quota is
  // checked against it). Needs a kernel with CONFIG_CFS_BANDWIDTH.
  void limit_cpu(const std::string& dir, double cpus) {
    cpu_ = dir;
    const std::string quota = dir + "/cpu.cfs_quota_us", period = dir + "/cpu.cfs_period_us";
    if (!cgfs::exists(quota)) {
      cpu_problem_ = "the kernel has no CFS bandwidth control (" + quota + " is missing)";
      return;
    }
    for (const auto& [file, value] :
         {std::pair{period, kCpuPeriodUs}, std::pair{quota, cpu_quota_us(cpus)}}) {
      if (int err = cgfs::write_file(file, std::to_string(value))) {
        cpu_problem_ = "cannot set " + file + ": " + sys::errno_text(err);
        return;
      }
    }
    cpu_limited_ = true;
  }
  void cpu_unavailable(std::string why) { cpu_problem_ = "cgroup v1: " + std::move(why); }

  void tighten(const Limits& limits) override {
    const auto set = [](const std::string& file, const std::string& value) {
      if (int err = cgfs::write_file(file, value))
        throw Error("cannot set " + file + ": " + sys::errno_text(err));
    };
    // limit_in_bytes may never exceed memsw: lowering, limit_in_bytes goes first; raising back
    // to the policy's (a recycled sandbox after a tightened run), memsw does.
    const std::string bytes = std::to_string(limits.memory_bytes);
    const std::string limit = memory_ + "/memory.limit_in_bytes";
    const std::string memsw = memory_ + "/memory.memsw.limit_in_bytes";
    if (!cgfs::exists(memsw)) {
      set(limit, bytes);
    } else if (cgfs::write_file(limit, bytes) == 0) {
      set(memsw, bytes);
    } else {
      set(memsw, bytes);
      set(limit, bytes);
    }
    set(pids_ + "/pids.max", std::to_string(limits.pids));
    if (limits.cpus && cpu_limited_)
      set(cpu_ + "/cpu.cfs_quota_us", std::to_string(cpu_quota_us(*limits.cpus)));
  }

 private:
  std::vector<host::UniqueFd> join_fds_;
  std::string memory_, pids_, cpu_;
};

std::string non_root_hint() {
  if (::geteuid() == 0) return "";
  return "cgroup v1 hierarchies cannot be safely delegated to ordinary users: run rlm-sandbox as "
         "root, or on a cgroup v2 host (see docs/cgroups.md)";
}

// Removes the groups made so far (they are empty: nothing was attached yet).
void undo(const std::vector<std::string>& made) {
  for (const auto& dir : made) ::rmdir(dir.c_str());
}

}  // namespace

std::unique_ptr<GroupDirs> create_v1(const HostCgroups& host, const Limits& limits,
                                     CgroupFailure& failure) {
  if (host.v1_memory.empty() || host.v1_pids.empty()) {
    failure.why = std::string("no cgroup v1 hierarchy carries the ") +
                  (host.v1_memory.empty() ? "memory" : "pids") + " controller";
    if (!host.note.empty()) failure.why += "; " + host.note;
    failure.fix =
        "mount the memory and pids controllers (cgroup v2: a kernel booted with "
        "systemd.unified_cgroup_hierarchy=1), see docs/cgroups.md";
    return nullptr;
  }
  const RunId id = next_run_id();
  // Hierarchies in attach order (memory first, so the limit applies as early as possible), each
  // once: cpuacct (accounting) and cpu (bandwidth, only for limits.cpus) may share one ("cpu,
  // cpuacct") or a hierarchy with memory or pids. Only memory and pids are required.
  std::vector<std::string> hierarchies{host.v1_memory, host.v1_pids};
  const auto add = [&](const std::string& hierarchy) {
    if (!hierarchy.empty() && !cgfs::contains(hierarchies, hierarchy))
      hierarchies.push_back(hierarchy);
  };
  add(host.v1_cpuacct);
  if (limits.cpus) add(host.v1_cpu);

  std::vector<std::string> made;
  std::vector<std::string> made_in;  // the hierarchy of each directory in `made`
  auto fail = [&](const std::string& what, int err) -> std::unique_ptr<GroupDirs> {
    undo(made);
    failure.why = "cgroup v1: " + what + ": " + sys::errno_text(err);
    failure.fix = non_root_hint();
    return nullptr;
  };
  std::string cpu_problem;
  for (std::size_t i = 0; i < hierarchies.size(); ++i) {
    const std::string parent = hierarchies[i] + "/" + kParentName;
    const std::string dir = parent + "/" + id.to_string();
    int err = 0;
    // The last run's teardown removes an empty parent; if that races with us, make it again.
    for (int attempt = 0; attempt < 8; ++attempt) {
      if ((err = cgfs::make_dir(parent)) != 0) break;
      err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;
      if (err != ENOENT) break;
    }
    if (err != 0) {
      if (i < 2) return fail("cannot create " + dir, err);
      // cpuacct and cpu are optional: the run goes on without them, and says what is missing.
      if (hierarchies[i] == host.v1_cpu)
        cpu_problem = "cannot create " + dir + ": " + sys::errno_text(err);
      continue;
    }
    made.push_back(dir);
    made_in.push_back(hierarchies[i]);
  }
  const auto dir_in = [&](const std::string& hierarchy) {
    for (std::size_t i = 0; i < made.size(); ++i)
      if (!hierarchy.empty() && made_in[i] == hierarchy) return made[i];
    return std::string();
  };
  const std::string memory = made[0];
  const std::string pids = made[1];
  const std::string cpuacct = dir_in(host.v1_cpuacct);

  const std::string bytes = std::to_string(limits.memory_bytes);
  // limit_in_bytes first: memsw must never be below it.
  if (int err = cgfs::write_file(memory + "/memory.limit_in_bytes", bytes)) {
    return fail("cannot set " + memory + "/memory.limit_in_bytes", err);
  }
  // memory + swap = memory: no swap. Absent when the kernel has no swap accounting.
  if (cgfs::exists(memory + "/memory.memsw.limit_in_bytes")) {
    if (int err = cgfs::write_file(memory + "/memory.memsw.limit_in_bytes", bytes)) {
      return fail("cannot set " + memory + "/memory.memsw.limit_in_bytes", err);
    }
  }
  // Best effort: without memsw this at least keeps the kernel from preferring swap.
  cgfs::write_file(memory + "/memory.swappiness", "0");
  if (int err = cgfs::write_file(pids + "/pids.max", std::to_string(limits.pids))) {
    return fail("cannot set " + pids + "/pids.max", err);
  }
  auto group = std::make_unique<V1Cgroup>(id, made, memory, pids, cpuacct);
  if (limits.cpus) {
    if (host.v1_cpu.empty()) {
      group->cpu_unavailable("no cgroup v1 hierarchy carries the cpu controller");
    } else if (const std::string cpu = dir_in(host.v1_cpu); cpu.empty()) {
      group->cpu_unavailable(cpu_problem);
    } else {
      group->limit_cpu(cpu, *limits.cpus);
    }
  }
  return group;
}

}  // namespace rlm::cgroup
