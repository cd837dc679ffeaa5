#include "docker/health.hpp"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <map>
#include <mutex>
#include <utility>

#include "http/http_client.hpp"
#include "supervisor/health_fields.hpp"

namespace rlm::docker {
namespace {

// "1.41" -> {1, 41}; {0, 0} when it does not parse.
std::pair<int, int> major_minor(std::string_view text) {
  int major = 0, minor = 0;
  const auto dot = text.find('.');
  if (dot == std::string_view::npos) return {0, 0};
  auto [end, ec] = std::from_chars(text.data(), text.data() + dot, major);
  if (ec != std::errc{} || end != text.data() + dot) return {0, 0};
  std::from_chars(text.data() + dot + 1, text.data() + text.size(), minor);
  return {major, minor};
}

std::string string_at(const nlohmann::json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : std::string();
}

// Policy fields as the policy JSON names them: all but namespaces.user, which depends on the
// daemon.
std::vector<std::string> enforced_fields() {
  std::vector<std::string> fields = {
      "limits.wall_time_ms", "limits.cpu_time_ms",  "limits.kill_grace_ms",   "limits.memory_bytes",
      "limits.pids",         "limits.output_bytes", "limits.file_size_bytes", "limits.open_files",
      "limits.tmpfs_bytes",  "limits.cpus",         "namespaces.pid",         "namespaces.net",
      "namespaces.mount",    "namespaces.ipc",      "namespaces.uts",         "namespaces.cgroup",
  };
  supervisor::append_sandbox_fields(fields);
  fields.push_back("docker.image");
  return fields;
}

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

std::string api_version_problem(const std::string& api_version, const std::string& version) {
  if (major_minor(api_version) >= major_minor(kApiVersion)) return "";
  return "the Docker daemon (version " + (version.empty() ? "unknown" : version) +
         ") speaks Engine API " + (api_version.empty() ? "of an unknown version" : api_version) +
         "; the docker backend needs " + std::string(kApiVersion) +
         " or newer: upgrade Docker to 20.10 or later";
}

DaemonInfo daemon_info(const EngineApi& api) {
  static std::mutex mutex;
  static std::map<std::string, DaemonInfo> known;
  {
    std::lock_guard lock(mutex);
    if (auto found = known.find(api.socket_path()); found != known.end()) return found->second;
  }
  DaemonInfo info;
  nlohmann::json version;
  try {
    version = api.expect_json("GET", "/version", nullptr, std::chrono::seconds(10));
  } catch (const DaemonError& error) {
    // A daemon older than the pinned version refuses the versioned path itself.
    if (error.status() != 400) throw;
    throw DaemonError(std::string(error.what()) + "; the docker backend needs Engine API " +
                      std::string(kApiVersion) + " or newer: upgrade Docker to 20.10 or later");
  }
  info.version = string_at(version, "Version");
  info.api_version = string_at(version, "ApiVersion");
  if (auto problem = api_version_problem(info.api_version, info.version); !problem.empty())
    throw DaemonError(problem);
  const auto system = api.expect_json("GET", "/info", nullptr, std::chrono::seconds(10));
  if (system.contains("SecurityOptions") && system["SecurityOptions"].is_array())
    for (const auto& option : system["SecurityOptions"])
      if (option.is_string() && option.get<std::string>().find("name=userns") != std::string::npos)
        info.traits.remaps_users = true;
  std::lock_guard lock(mutex);
  known[api.socket_path()] = info;
  return info;
}

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
  health.enforced = enforced_fields();
  health.network = {"none", "host"};
  // An allowlist is set up by joining a holder container's network namespace from this process:
  // root, with the daemon on this host (docs/network.md).
  if (geteuid() == 0)
    health.network.push_back("allowlist");
  else
    health.detail +=
        "; an egress allowlist is enforced only when rlm-sandbox runs as root (it joins a "
        "container's network namespace)";
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
