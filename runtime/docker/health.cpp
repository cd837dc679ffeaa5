#include "docker/health.hpp"

#include <atomic>

#include "docker/daemon_info.hpp"
#include "docker/engine_api.hpp"
#include "http/http_client.hpp"

namespace rlm::docker {
namespace {

// Policy fields as the policy JSON names them.
const std::vector<std::string> kEnforced = {
    "limits.wall_time_ms",
    "limits.cpu_time_ms",
    "limits.kill_grace_ms",
    "limits.memory_bytes",
    "limits.pids",
    "limits.output_bytes",
    "limits.file_size_bytes",
    "limits.open_files",
    "limits.tmpfs_bytes",
    "limits.cpus",
    "namespaces.pid",
    "namespaces.net",
    "namespaces.mount",
    "namespaces.ipc",
    "namespaces.uts",
    "namespaces.cgroup",
    "filesystem.mounts",
    "filesystem.workdir",
    "network",
    "seccomp",
    "capabilities",
    "env",
    "user",
    "hostname",
    "docker.image",
};

constexpr const char* kNoHttp =
    "this build of rlm-sandbox has no HTTP client, which the docker backend needs to talk to the "
    "daemon; use the dynamically linked rlm-sandbox (or the library)";

// "" when the daemon answers with a new enough API; remembered once true.
std::string daemon_problem(const Endpoint& endpoint, DaemonInfo* info) {
  static std::atomic<bool> known_good{false};
  if (!endpoint.problem.empty()) return endpoint.problem;
  if (auto problem = socket_problem(endpoint.socket_path); !problem.empty()) return problem;
  if (known_good.load() && info == nullptr) return "";
  try {
    const auto found = daemon_info(EngineApi(endpoint.socket_path));
    if (info) *info = found;
  } catch (const std::exception& error) {
    return error.what();
  }
  known_good.store(true);
  return "";
}

// The fix part of a problem message ("...; start it: ..."), for Health::fix.
std::string fix_of(const std::string& problem) {
  for (const char* marker : {"start it: ", "add your user", "upgrade Docker", "set DOCKER_HOST"}) {
    const auto at = problem.find(marker);
    if (at != std::string::npos) return problem.substr(at);
  }
  return "";
}

}  // namespace

std::string docker_unavailable_reason() {
  // The static CLI has no HTTP client: selection reaching docker re-executes the full binary,
  // which can tell whether a daemon is there.
  if (!http::available()) throw NeedsFullBinary(kNoHttp);
  try {
    return daemon_problem(endpoint_from_environment(), nullptr);
  } catch (const std::exception& error) {
    return error.what();
  }
}

Health docker_health() {
  if (!http::available()) throw NeedsFullBinary(kNoHttp);
  Health health;
  health.backend = "docker";
  health.isolated = true;
  const auto endpoint = endpoint_from_environment();
  DaemonInfo info;
  if (auto problem = daemon_problem(endpoint, &info); !problem.empty()) {
    health.detail = problem;
    health.fix = fix_of(problem);
    return health;
  }
  health.available = true;
  health.detail =
      "Docker Engine " + info.version + " (API " + info.api_version + ", pinned to " +
      std::string(kApiVersion) + ") at " + endpoint.socket_path +
      "; one container per run or session under Docker's init, read-only root filesystem, "
      "capabilities dropped, no-new-privileges, the policy's seccomp profile, cgroup memory and "
      "pids limits, labelled rlm-sandbox=1";
  health.enforced = kEnforced;
  if (info.traits.remaps_users) {
    health.enforced.push_back("namespaces.user");
  } else {
    health.unenforced.push_back("namespaces.user");
    health.detail +=
        "; no user namespace (the daemon does not use userns-remap): the payload runs as the "
        "policy's non-root uid, and a policy with uid 0 is refused unless it sets "
        "namespaces.user to false";
  }
  return health;
}

}  // namespace rlm::docker
