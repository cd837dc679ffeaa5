// Teardown shared by v1 and v2: kill every member, then rmdir, bounded and exception-free.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>

#include "namespace/cgroup_fs.hpp"
#include "namespace/cgroup_impl.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

GroupDirs::GroupDirs(const RunId& id, std::vector<std::string> dirs)
    : suffix_(std::string("/") + kParentName + "/" + id.to_string()), dirs_(std::move(dirs)) {}

GroupDirs::~GroupDirs() {
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
                  cgfs::errno_text(err));
    }
  }
}

}  // namespace rlm::ns
