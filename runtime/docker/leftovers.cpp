#include "docker/leftovers.hpp"

#include <mutex>
#include <set>

#include "docker/container_control.hpp"
#include "docker/ownership.hpp"

namespace rlm::docker {
namespace {

std::string label_of(const nlohmann::json& container, std::string_view key) {
  const auto& labels = container.contains("Labels") ? container["Labels"] : nlohmann::json();
  if (!labels.is_object() || !labels.contains(key) || !labels[std::string(key)].is_string())
    return "";
  return labels[std::string(key)].get<std::string>();
}

}  // namespace

int collect_stale_containers(const EngineApi& api) noexcept {
  int removed = 0;
  try {
    const nlohmann::json filters = {{"label", {std::string(kManagedLabel) + "=1"}}};
    const auto containers =
        api.expect_json("GET", "/containers/json?all=1&filters=" + url_encode(filters.dump()),
                        nullptr, std::chrono::seconds(10));
    if (!containers.is_array()) return 0;
    for (const auto& container : containers) {
      if (!container.contains("Id") || !container["Id"].is_string()) continue;
      const auto state =
          owner_state(label_of(container, kOwnerLabel), label_of(container, kBootLabel));
      if (state != OwnerState::dead) continue;
      if (remove_container(api, container["Id"].get<std::string>()).empty()) ++removed;
    }
  } catch (...) {
    // Leftovers of a crashed runtime are not this run's problem.
  }
  return removed;
}

void collect_stale_containers_once(const EngineApi& api) noexcept {
  static std::mutex mutex;
  static std::set<std::string> done;
  try {
    std::lock_guard lock(mutex);
    if (!done.insert(api.socket_path()).second) return;
  } catch (...) {
    return;
  }
  collect_stale_containers(api);
}

}  // namespace rlm::docker
