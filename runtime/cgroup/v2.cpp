// cgroup v2: one group, <parent>/rlm-sandbox/<run-id> (see v2_parent.cpp for where the
// parent is), with memory.max, memory.swap.max = 0, pids.max and, for limits.cpus, cpu.max
// (when the cpu controller reaches it), and a directory fd for
// clone3(CLONE_INTO_CGROUP) so the child never runs a single instruction outside its limits.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "cgroup/files.hpp"
#include "cgroup/group.hpp"
#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::cgroup {
namespace {

class V2Cgroup final : public GroupDirs {
 public:
  V2Cgroup(const RunId& id, std::string dir, host::UniqueFd fd)
      : GroupDirs(id, {dir}, UsageReader::v2(dir)), dir_(std::move(dir)), fd_(std::move(fd)) {}

  ~V2Cgroup() override {
    // cgroup.kill (5.14+) kills every member and anything forked meanwhile in one step; the base
    // destructor then waits for the group to empty and removes it.
    try {
      cgfs::write_file(dir_ + "/cgroup.kill", "1");
    } catch (...) {  // allocation only; the base destructor's kill loop still runs
    }
  }

  int clone_into_fd() const override { return fd_.get(); }
  void attach(pid_t pid) override { attach_all(pid); }

  void kill_all() override {
    cgfs::write_file(dir_ + "/cgroup.kill", "1");  // ENOENT before 5.14: the loop does it all
    GroupDirs::kill_all();
  }

  std::string describe() const override { return "cgroup v2 " + dir_; }

  bool begin_next_run() override {
    // What the last run read stays in the page cache, charged here; above this it is reclaimed
    // (so the next run starts with its memory limit's room), below it the next run may reuse it.
    constexpr std::uint64_t kLeftChargeBytes = 32 << 20;
    if (const auto current = cgfs::read_number(dir_ + "/memory.current");
        current && *current > kLeftChargeBytes)
      cgfs::write_file(dir_ + "/memory.reclaim", std::to_string(*current));  // best effort
    return GroupDirs::begin_next_run();
  }

  void tighten(const Limits& limits) override {
    const auto set = [this](const char* file, const std::string& value) {
      if (int err = cgfs::write_file(dir_ + "/" + file, value))
        throw Error("cannot set " + dir_ + "/" + file + ": " + sys::errno_text(err));
    };
    set("memory.max", std::to_string(limits.memory_bytes));
    set("pids.max", std::to_string(limits.pids));
    if (limits.cpus && cpu_limited_)
      set("cpu.max",
          std::to_string(cpu_quota_us(*limits.cpus)) + " " + std::to_string(kCpuPeriodUs));
  }

  // cpu.max "<quota> <period>": the group's processes together get `cpus` CPUs' worth of time.
  void limit_cpu(double cpus) {
    const std::string file = dir_ + "/cpu.max";
    if (!cgfs::exists(file)) {
      cpu_problem_ = "the cpu controller is not enabled for " + dir_ +
                     " (its parent cgroup does not pass cpu down; see docs/cgroups.md)";
      return;
    }
    const std::string value =
        std::to_string(cpu_quota_us(cpus)) + " " + std::to_string(kCpuPeriodUs);
    if (int err = cgfs::write_file(file, value)) {
      cpu_problem_ = "cannot set " + file + ": " + sys::errno_text(err);
      return;
    }
    cpu_limited_ = true;
  }

 private:
  std::string dir_;
  host::UniqueFd fd_;
};

// One attempt at <parent>/<id> with its limits. ENOENT anywhere means the parent was removed by
// another run's teardown (and perhaps made again, without controllers yet): `failure.raced`.
std::unique_ptr<GroupDirs> make_group(const std::string& parent, const RunId& id,
                                      const Limits& limits, CgroupFailure& failure) {
  const std::string dir = parent + "/" + id.to_string();
  if (::mkdir(dir.c_str(), 0755) != 0) {
    const int err = errno;
    failure.raced = err == ENOENT;
    failure.why = "cgroup v2: cannot create " + dir + ": " + sys::errno_text(err);
    return nullptr;
  }
  auto fail = [&](const std::string& what, int err) -> std::unique_ptr<GroupDirs> {
    ::rmdir(dir.c_str());  // still empty: nothing was attached
    failure.raced = err == ENOENT;
    failure.why = "cgroup v2: " + what + ": " + sys::errno_text(err);
    return nullptr;
  };
  if (int err = cgfs::write_file(dir + "/memory.max", std::to_string(limits.memory_bytes))) {
    return fail("cannot set " + dir + "/memory.max", err);
  }
  // No swap: the memory limit must mean memory. Absent without swap accounting.
  if (cgfs::exists(dir + "/memory.swap.max")) {
    if (int err = cgfs::write_file(dir + "/memory.swap.max", "0")) {
      return fail("cannot set " + dir + "/memory.swap.max", err);
    }
  }
  if (int err = cgfs::write_file(dir + "/pids.max", std::to_string(limits.pids))) {
    return fail("cannot set " + dir + "/pids.max", err);
  }
  host::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return fail("cannot open " + dir, err);
  }
  auto group = std::make_unique<V2Cgroup>(id, dir, std::move(fd));
  if (limits.cpus) group->limit_cpu(*limits.cpus);
  return group;
}

}  // namespace

std::unique_ptr<GroupDirs> create_v2(const HostCgroups& host, const Limits& limits,
                                     CgroupFailure& failure) {
  const RunId id = next_run_id();
  // The last run's teardown removes an empty parent; if that races with us, prepare it again.
  for (int attempt = 0; attempt < 16; ++attempt) {
    failure = {};
    const std::string parent = prepare_v2_parent(host, limits.cpus.has_value(), failure);
    if (parent.empty() && !failure.raced) return nullptr;
    if (parent.empty()) continue;
    if (auto group = make_group(parent, id, limits, failure)) return group;
    if (!failure.raced) {
      failure.fix = v2_fix(host, false);
      return nullptr;
    }
  }
  failure.why =
      "cgroup v2: the rlm-sandbox parent kept vanishing under concurrent runs: " + failure.why;
  failure.fix = v2_fix(host, false);
  return nullptr;
}

}  // namespace rlm::cgroup
