#include "docker/container_cgroup.hpp"

#include "namespace/cgroup_detect.hpp"
#include "namespace/cgroup_fs.hpp"

namespace rlm::docker {
namespace {

// The hierarchy mounted at `mount_point`, as detect_host_cgroups() reports only the paths.
std::optional<ns::CgroupMount> mount_at(const std::string& mount_point) {
  const auto mountinfo = ns::cgfs::read_file("/proc/self/mountinfo");
  if (!mountinfo) return std::nullopt;
  for (auto& mount : ns::parse_mountinfo(*mountinfo))
    if (mount.mount_point == mount_point) return mount;
  return std::nullopt;
}

// The directory of `path` in the hierarchy at `mount_point`, "" when it is not reachable.
std::string directory(const std::string& mount_point, const std::string& path) {
  if (mount_point.empty()) return "";
  const auto mount = mount_at(mount_point);
  return mount ? ns::cgroup_dir(*mount, path) : "";
}

}  // namespace

std::optional<ContainerCgroup> ContainerCgroup::find(pid_t container_pid,
                                                     const std::string& container_id) {
  if (container_pid <= 0 || container_id.empty()) return std::nullopt;
  const auto text = ns::cgfs::read_file("/proc/" + std::to_string(container_pid) + "/cgroup");
  if (!text) return std::nullopt;
  const auto groups = ns::parse_proc_cgroup(*text);
  const auto names_container = [&](const std::string& path) {
    return path.find(container_id) != std::string::npos;
  };
  const auto host = ns::detect_host_cgroups();

  ContainerCgroup cgroup;
  const auto memory = groups.v1.find("memory");
  const auto cpuacct = groups.v1.find("cpuacct");
  if (memory != groups.v1.end() && cpuacct != groups.v1.end() && !host.v1_memory.empty()) {
    if (!names_container(memory->second) || !names_container(cpuacct->second)) return std::nullopt;
    cgroup.memory_dir_ = directory(host.v1_memory, memory->second);
    cgroup.cpu_dir_ = directory(host.v1_cpuacct, cpuacct->second);
  } else if (groups.unified && host.v2) {
    if (!names_container(*groups.unified)) return std::nullopt;
    cgroup.v2_ = true;
    cgroup.memory_dir_ = ns::cgroup_dir(*host.v2, *groups.unified);
    cgroup.cpu_dir_ = cgroup.memory_dir_;
  }
  if (cgroup.memory_dir_.empty() && cgroup.cpu_dir_.empty()) return std::nullopt;
  return cgroup;
}

CgroupReading ContainerCgroup::read() const {
  namespace cgfs = ns::cgfs;
  CgroupReading reading;
  if (v2_) {
    reading.peak_memory_bytes = cgfs::read_number(memory_dir_ + "/memory.peak");  // kernel 5.19+
    reading.oom_kills = cgfs::read_key(memory_dir_ + "/memory.events", "oom_kill");
    if (auto usec = cgfs::read_key(cpu_dir_ + "/cpu.stat", "usage_usec"))
      reading.cpu_nanoseconds = *usec * 1000;
    return reading;
  }
  if (!memory_dir_.empty()) {
    reading.peak_memory_bytes = cgfs::read_number(memory_dir_ + "/memory.max_usage_in_bytes");
    reading.oom_kills = cgfs::read_key(memory_dir_ + "/memory.oom_control", "oom_kill");
  }
  if (!cpu_dir_.empty()) reading.cpu_nanoseconds = cgfs::read_number(cpu_dir_ + "/cpuacct.usage");
  return reading;
}

}  // namespace rlm::docker
