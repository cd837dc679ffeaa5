// Bind sources that would hand a sandbox the host's kernel interfaces: /proc, /sys and /dev (by
// path, as written or as resolved), any procfs, sysfs, devtmpfs, cgroupfs, nsfs, ... mounted
// elsewhere, and any directory holding one below it ("/" holds them all). A policy binds them
// only with filesystem.allow_kernel_interface_binds.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::policy {

class KernelInterfaces {
 public:
  // Reads this mount namespace's mount table once (/proc/self/mountinfo; none when unreadable).
  KernelInterfaces();

  // Why binding the host path `source` exposes a kernel interface ("is under /proc", "holds a
  // sysfs filesystem mounted at /x/sys"), or nullopt when it does not.
  std::optional<std::string> in(std::string_view source) const;

 private:
  struct KernelMount {
    std::string point;
    std::string type;
  };
  std::vector<KernelMount> kernel_mounts_;
  // For each mount point, the filesystem type of the mount that is on top there.
  std::vector<KernelMount> all_mounts_;
};

}  // namespace rlm::policy
