// Stale-group collection: a runtime killed mid-run (SIGKILL, OOM, power cut of the process) leaves
// its groups behind, maybe with payload processes in them. Only directories directly inside an
// "rlm-sandbox" parent whose name parses as a run id (cgroup_run_id.hpp) of a dead owner in our
// PID namespace are touched; everything else on the host is left alone.
#include <dirent.h>

#include "namespace/cgroup.hpp"
#include "namespace/cgroup_fs.hpp"
#include "namespace/cgroup_impl.hpp"

namespace rlm::ns {
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

}  // namespace rlm::ns
