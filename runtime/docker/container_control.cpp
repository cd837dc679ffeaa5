#include "docker/container_control.hpp"

#include <algorithm>
#include <mutex>
#include <set>

#include "docker/ownership.hpp"
#include "docker/trust_store.hpp"

namespace rlm::docker {
namespace {

std::string path_of(const std::string& id, std::string_view what) {
  return "/containers/" + id + std::string(what);
}

std::string label_of(const nlohmann::json& container, std::string_view key) {
  const auto& labels = container.contains("Labels") ? container["Labels"] : nlohmann::json();
  if (!labels.is_object() || !labels.contains(key) || !labels[std::string(key)].is_string())
    return "";
  return labels[std::string(key)].get<std::string>();
}

}  // namespace

std::string create_container(const EngineApi& api, const nlohmann::json& body,
                             const std::string& name) {
  const std::string path = "/containers/create?name=" + url_encode(name);
  const auto reply = api.call("POST", path, &body);
  if (reply.status == 404) {
    const std::string image = body.value("Image", std::string());
    throw DaemonError("the image " + image +
                          " is not in the Docker daemon's image store (Docker: " + reply.message() +
                          "); get it with `docker pull " + image +
                          "`, or build or import it locally (`docker build`, or `docker import` "
                          "of a root filesystem tarball; see docs/docker-backend.md), or choose "
                          "another with --image or the policy's docker.image",
                      404);
  }
  if (!reply.ok()) throw api.failure("POST", path, reply);
  const auto created = reply.json();
  if (!created.is_object() || !created.contains("Id") || !created["Id"].is_string())
    throw DaemonError("the Docker daemon created a container but did not say its id: " +
                      reply.body.substr(0, 200));
  return created["Id"].get<std::string>();
}

void start_container(const EngineApi& api, const std::string& id) {
  try {
    api.expect_ok("POST", path_of(id, "/start"));
  } catch (const DaemonError& error) {
    // Under load the daemon may start the task on a retry of its own and then answer 500 "cannot
    // start an already running container": it was started, which is all this asked.
    if (std::string_view(error.what()).find("already running container") == std::string::npos)
      throw;
  }
}

bool wait_for_exit(const EngineApi& api, const std::string& id, std::chrono::milliseconds timeout) {
  timeout = std::max(timeout, std::chrono::milliseconds(1));
  const std::string path = path_of(id, "/wait?condition=not-running");
  const auto reply = api.call("POST", path, nullptr, timeout);
  if (reply.timed_out) return false;
  if (reply.status == 404) return true;  // already removed
  if (!reply.ok()) throw api.failure("POST", path, reply);
  return true;
}

void stop_container(const EngineApi& api, const std::string& id, std::chrono::milliseconds grace) {
  const auto signal = [&](const char* name) {
    const std::string path = path_of(id, std::string("/kill?signal=") + name);
    const auto reply = api.call("POST", path);
    // 409: it is not running (any more); 404: it is gone. Either way there is nothing to signal.
    if (!reply.ok() && reply.status != 409 && reply.status != 404)
      throw api.failure("POST", path, reply);
  };
  if (grace.count() > 0) {
    signal("TERM");
    if (wait_for_exit(api, id, grace)) return;
  }
  signal("KILL");
  if (!wait_for_exit(api, id, std::chrono::seconds(30)))
    throw DaemonError("container " + id.substr(0, 12) + " did not stop within 30 s of SIGKILL");
}

std::string remove_container(const EngineApi& api, const std::string& id) noexcept {
  try {
    const std::string path = path_of(id, "?force=1&v=1");
    const auto reply = api.call("DELETE", path);
    // 404: already gone; 409 while another caller's removal of it is under way.
    if (reply.ok() || reply.status == 404) return "";
    if (reply.status == 409 && reply.message().find("already in progress") != std::string::npos)
      return "";
    return api.failure("DELETE", path, reply).what();
  } catch (const std::exception& error) {
    return error.what();
  }
}

ContainerState inspect_state(const EngineApi& api, const std::string& id) {
  const auto inspected = api.expect_json("GET", path_of(id, "/json"));
  ContainerState state;
  const auto& s = inspected.contains("State") ? inspected["State"] : nlohmann::json::object();
  state.running = s.value("Running", false);
  state.oom_killed = s.value("OOMKilled", false);
  state.pid = s.value("Pid", 0);
  if (s.contains("ExitCode") && s["ExitCode"].is_number_integer())
    state.exit_code = s["ExitCode"].get<int>();
  return state;
}

std::string ContainerRemover::remove() noexcept {
  if (id_.empty()) return "";
  auto problem = remove_container(api_, id_);
  id_.clear();
  return problem;
}

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
      // A crashed run's trust store for injected credentials (egress_holder.hpp) goes with it.
      if (const auto owner = label_of(container, kOwnerLabel); !owner.empty())
        remove_trust_directory(std::string(owner));
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
