#include "docker/ownership.hpp"

#include <fstream>

#include "cgroup/run_id.hpp"

namespace rlm::docker {

std::string new_owned_id() {
  return cgroup::next_run_id().to_string();
}

std::string boot_id() {
  static const std::string id = [] {
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(file, line);
    return line;
  }();
  return id;
}

OwnerState owner_state(std::string_view owner_label, std::string_view boot_label) {
  const auto id = cgroup::parse_run_id(owner_label);
  if (!id || boot_label.empty() || boot_id().empty()) return OwnerState::unknown;
  // Containers survive a reboot (restart policies, a stopped container); their owner did not.
  if (boot_label != boot_id()) return OwnerState::dead;
  switch (cgroup::owner_state(*id)) {
    case cgroup::Owner::alive:
      return OwnerState::alive;
    case cgroup::Owner::dead:
      return OwnerState::dead;
    default:
      return OwnerState::unknown;
  }
}

}  // namespace rlm::docker
