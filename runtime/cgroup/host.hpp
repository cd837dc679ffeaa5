// Where this host's cgroup hierarchies are and which cgroup this process is in, from
// /proc/self/mountinfo and /proc/self/cgroup. Reads only; never writes anything.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::cgroup {

struct CgroupMount {
  std::string mount_point;               // "/sys/fs/cgroup/memory"
  std::string root;                      // the cgroup shown at the mount point ("/" normally)
  bool v2 = false;                       // fstype cgroup2
  std::vector<std::string> controllers;  // v1: from the super options ("cpu", "name=systemd")
};
// The cgroup and cgroup2 mounts in a /proc/<pid>/mountinfo text.
std::vector<CgroupMount> cgroup_mounts(std::string_view mountinfo);

struct OwnCgroups {
  std::optional<std::string> unified;     // "0::<path>"
  std::map<std::string, std::string> v1;  // controller ("memory", "name=systemd") -> path
};
OwnCgroups parse_proc_cgroup(std::string_view text);

// What the runtime can use.
struct HostCgroups {
  // cgroup v2: the unified mount, when its root offers both memory and pids.
  std::optional<CgroupMount> v2;
  std::string v2_own;  // this process's cgroup directory in it; "" when outside the mount's view
  // cgroup v1: the mount point of the hierarchy carrying each controller we use ("" if none).
  // cpu and cpuacct are often co-mounted ("cpu,cpuacct"): then both name the same mount point.
  std::string v1_memory, v1_pids, v1_cpuacct, v1_cpu;
  // Why a unified mount was not usable (a hybrid host), for messages.
  std::string note;
};
HostCgroups detect_host_cgroups();

// Joins a mount point and a cgroup path: ("/sys/fs/cgroup", "/a/b") -> "/sys/fs/cgroup/a/b";
// the mount's own root ("/") maps to the mount point itself. "" when `path` lies outside `root`.
std::string cgroup_dir(const CgroupMount& mount, const std::string& path);

}  // namespace rlm::cgroup
