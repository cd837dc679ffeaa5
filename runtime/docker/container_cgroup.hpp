// A running container's cgroup, read straight from this host's cgroupfs: its peak memory, CPU time
// and OOM kills. Docker's stats endpoint would say the same but answers once a second at best
// (its collector's interval), which would add a second to every run; these files answer in
// microseconds. Found from the container's PID 1 as the daemon reports it, and only trusted when
// that process's cgroup path names the container (a daemon in another PID namespace reports pids
// that mean something else here): otherwise usage is simply not available.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace rlm::docker {

struct CgroupReading {
  std::optional<std::uint64_t> peak_memory_bytes;  // v1 max_usage_in_bytes, v2 memory.peak
  std::optional<std::uint64_t> cpu_nanoseconds;    // the whole container's CPU time
  std::optional<std::uint64_t> oom_kills;          // processes the OOM killer took in it
};

class ContainerCgroup {
 public:
  // nullopt when the container's cgroup cannot be found from here.
  static std::optional<ContainerCgroup> find(pid_t container_pid, const std::string& container_id);

  // Empty fields once the cgroup is gone (the container exited) or a file is missing.
  CgroupReading read() const;

 private:
  std::string memory_dir_;  // v1 memory hierarchy, or the v2 group
  std::string cpu_dir_;     // v1 cpuacct hierarchy, or the v2 group
  bool v2_ = false;
};

}  // namespace rlm::docker
