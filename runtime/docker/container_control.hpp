// The container lifecycle calls of a run (a session's worker is one too): create (with the
// image-missing message), start, wait, stop (SIGTERM, the policy's grace, SIGKILL), inspect, and
// removal that never throws; and the removal of what a crashed runtime left behind.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "docker/engine_api.hpp"

namespace rlm::docker {

// Creates the container named `name`; returns its id. Throws DaemonError; for an image the daemon
// does not have, the message says how to get it.
std::string create_container(const EngineApi& api, const nlohmann::json& body,
                             const std::string& name);

// Starts it; a daemon that answers "already running" (its own retry under load started it) is
// taken at its word.
void start_container(const EngineApi& api, const std::string& id);

// True once the container is not running; false when `timeout` passed first.
bool wait_for_exit(const EngineApi& api, const std::string& id, std::chrono::milliseconds timeout);

// SIGTERM to the container's PID 1 (Docker's init forwards it), SIGKILL to the whole container
// once `grace` has passed, then waits for it to be down. Throws DaemonError.
void stop_container(const EngineApi& api, const std::string& id, std::chrono::milliseconds grace);

// DELETE ?force=1 (kills what still runs). Never throws: returns what went wrong, "" on success.
std::string remove_container(const EngineApi& api, const std::string& id) noexcept;

struct ContainerState {
  bool running = false;
  int pid = 0;  // its PID 1 on the daemon's host, 0 when not running
  std::optional<int> exit_code;
  bool oom_killed = false;
};
ContainerState inspect_state(const EngineApi& api, const std::string& id);

// Removes the container it holds when it goes out of scope, whatever happened.
class ContainerRemover {
 public:
  explicit ContainerRemover(const EngineApi& api) : api_(api) {}
  ~ContainerRemover() { remove(); }
  ContainerRemover(const ContainerRemover&) = delete;
  ContainerRemover& operator=(const ContainerRemover&) = delete;

  void hold(std::string id) { id_ = std::move(id); }
  // Removes it now; returns the problem, "" when it is gone (or there was none).
  std::string remove() noexcept;

 private:
  const EngineApi& api_;
  std::string id_;
};

// ---- Leftovers --------------------------------------------------------------------------------
// Containers a crashed runtime left behind: every labelled container whose owner process is
// certainly gone (ownership.hpp) is removed, once per socket per process, before the first
// container this process makes. Containers of live owners, of owners in another PID namespace,
// and anything without our labels are never touched.

// Removes them now; returns how many were removed. Best effort: never throws.
int collect_stale_containers(const EngineApi& api) noexcept;

// collect_stale_containers() on the first call per socket path in this process.
void collect_stale_containers_once(const EngineApi& api) noexcept;

}  // namespace rlm::docker
