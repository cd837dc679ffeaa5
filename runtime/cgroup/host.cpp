#include "cgroup/host.hpp"

#include "cgroup/files.hpp"
#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::cgroup {
namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    auto at = text.find(sep);
    out.push_back(text.substr(0, at));
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return out;
}

bool has(const std::vector<std::string>& words, std::string_view w) {
  return cgfs::contains(words, w);
}

}  // namespace

std::vector<CgroupMount> cgroup_mounts(std::string_view mountinfo) {
  std::vector<CgroupMount> out;
  for (auto& mount : sys::parse_mountinfo(mountinfo)) {
    if (mount.fs_type != "cgroup" && mount.fs_type != "cgroup2") continue;
    CgroupMount m;
    m.root = std::move(mount.root);
    m.mount_point = std::move(mount.mount_point);
    m.v2 = mount.fs_type == "cgroup2";
    if (!m.v2) {
      for (std::string_view opt : split(mount.super_options, ',')) {
        if (opt == "rw" || opt == "ro" || opt.empty()) continue;
        m.controllers.emplace_back(opt);
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

OwnCgroups parse_proc_cgroup(std::string_view text) {
  OwnCgroups own;
  for (std::string_view line : split(text, '\n')) {
    // hierarchy-id:controller-list:path (the path may itself contain ':')
    auto first = line.find(':');
    if (first == std::string_view::npos) continue;
    auto second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string_view id = line.substr(0, first);
    std::string_view controllers = line.substr(first + 1, second - first - 1);
    std::string path(line.substr(second + 1));
    if (id == "0" && controllers.empty()) {
      own.unified = path;
      continue;
    }
    for (std::string_view c : split(controllers, ',')) {
      if (!c.empty()) own.v1[std::string(c)] = path;
    }
  }
  return own;
}

std::string cgroup_dir(const CgroupMount& mount, const std::string& path) {
  if (path.empty() || path[0] != '/') return "";
  // A cgroup outside this process's cgroup namespace shows as "/../..": not reachable here.
  if (path == "/.." || path.rfind("/../", 0) == 0) return "";
  std::string rel;
  if (mount.root == "/") {
    rel = path;
  } else if (path == mount.root) {
    rel = "/";
  } else if (path.rfind(mount.root + "/", 0) == 0) {
    rel = path.substr(mount.root.size());
  } else {
    return "";
  }
  return rel == "/" ? mount.mount_point : mount.mount_point + rel;
}

HostCgroups detect_host_cgroups() {
  HostCgroups host;
  const auto mountinfo = sys::self_mountinfo();
  const auto self = sys::self_cgroup();
  if (!mountinfo || !self) {
    host.note = "cannot read /proc/self/mountinfo or /proc/self/cgroup (is /proc mounted?)";
    return host;
  }
  const auto mounts = cgroup_mounts(*mountinfo);
  const auto own = parse_proc_cgroup(*self);

  // cgroup v2: prefer /sys/fs/cgroup itself; the first other unified mount otherwise.
  const CgroupMount* unified = nullptr;
  for (const auto& m : mounts) {
    if (!m.v2) continue;
    if (unified == nullptr || m.mount_point == "/sys/fs/cgroup") unified = &m;
  }
  if (unified != nullptr) {
    auto available = cgfs::read_words(unified->mount_point + "/cgroup.controllers");
    if (has(available, "memory") && has(available, "pids")) {
      host.v2 = *unified;
      if (own.unified) host.v2_own = cgroup_dir(*unified, *own.unified);
    } else {
      std::string list;
      for (const auto& c : available) list += (list.empty() ? "" : " ") + c;
      host.note = "the cgroup2 mount at " + unified->mount_point + " offers " +
                  (list.empty() ? std::string("no controllers") : "only: " + list) +
                  " (a hybrid host: memory and pids live on cgroup v1 hierarchies)";
    }
  }

  // cgroup v1: the first mount of each hierarchy that carries a controller we use.
  for (const auto& m : mounts) {
    if (m.v2) continue;
    if (host.v1_memory.empty() && has(m.controllers, "memory")) host.v1_memory = m.mount_point;
    if (host.v1_pids.empty() && has(m.controllers, "pids")) host.v1_pids = m.mount_point;
    if (host.v1_cpuacct.empty() && has(m.controllers, "cpuacct")) host.v1_cpuacct = m.mount_point;
    if (host.v1_cpu.empty() && has(m.controllers, "cpu")) host.v1_cpu = m.mount_point;
  }
  return host;
}

}  // namespace rlm::cgroup
