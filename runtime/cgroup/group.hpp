// Internal to the cgroup code: what v1 and v2 groups share, and their factories.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cgroup/cgroup.hpp"
#include "cgroup/host.hpp"
#include "cgroup/run_id.hpp"
#include "cgroup/usage.hpp"

namespace rlm::cgroup {

inline constexpr const char* kParentName = "rlm-sandbox";
// v2: where the processes of a busy cgroup of ours go, so that it can pass controllers down.
inline constexpr const char* kLeafName = "leaf";
// kill_all() waits this long for the group to empty; the destructor this long to rmdir.
inline constexpr std::chrono::milliseconds kKillTimeout{2000};
inline constexpr std::chrono::milliseconds kRemoveTimeout{5000};

// Why a group could not be made, and what the user can do about it.
struct CgroupFailure {
  std::string why;
  std::string fix;
  // The rlm-sandbox parent vanished (or was re-made) under us: another run's teardown removed it
  // while it looked empty. Not a failure to report: the creator tries again.
  bool raced = false;
};

// The run's directories (one on v2, one per hierarchy on v1), killed and removed on destruction,
// and read by `reader`.
class GroupDirs : public RunCgroup {
 public:
  ~GroupDirs() override;
  void kill_all() override;
  const std::vector<std::string>& dirs() const { return dirs_; }
  bool cpu_bandwidth_limited() const override { return cpu_limited_; }
  std::string cpu_bandwidth_problem() const override { return cpu_problem_; }
  CgroupUsage usage() const override { return reader_.read(); }
  std::uint64_t oom_kills() const override { return reader_.oom_kills().value_or(0); }
  std::optional<std::chrono::microseconds> cpu_time() const override { return reader_.cpu_time(); }
  bool begin_next_run() override;
  bool empty() const override;

 protected:
  GroupDirs(const RunId& id, std::vector<std::string> dirs, UsageReader reader);
  void attach_all(pid_t pid);  // writes pid to every directory's cgroup.procs; throws Error
  std::string suffix_;         // "/rlm-sandbox/<id>": how /proc/<pid>/cgroup names membership
  std::vector<std::string> dirs_;
  UsageReader reader_;
  bool cpu_limited_ = false;  // limits.cpus was written to the group
  std::string cpu_problem_;   // why limits.cpus could not be, when it was asked for
};

// CFS bandwidth for limits.cpus: the quota per period, in microseconds ("50000 100000" for 0.5).
inline constexpr std::uint64_t kCpuPeriodUs = 100'000;
std::uint64_t cpu_quota_us(double cpus);

std::unique_ptr<GroupDirs> create_v2(const HostCgroups& host, const Limits& limits,
                                     CgroupFailure& failure);
std::unique_ptr<GroupDirs> create_v1(const HostCgroups& host, const Limits& limits,
                                     CgroupFailure& failure);

// v2: finds (or makes) the "rlm-sandbox" parent whose children get the memory and pids
// controllers -- and cpu when `want_cpu`, where it is available (best effort: a parent without it
// is still used); "" with `failure` set when there is none this process may use.
std::string prepare_v2_parent(const HostCgroups& host, bool want_cpu, CgroupFailure& failure);

// What to tell a user whose v2 host gave no usable cgroup; `busy` when our own cgroup holds
// processes (the no-internal-processes rule).
std::string v2_fix(const HostCgroups& host, bool busy);

// Every "rlm-sandbox" parent directory this process might have used on v2 (own cgroup, its
// delegated parent, the hierarchy root), existing or not.
std::vector<std::string> v2_parent_dirs(const HostCgroups& host);

}  // namespace rlm::cgroup
