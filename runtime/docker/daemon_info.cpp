#include "docker/daemon_info.hpp"

#include <charconv>
#include <map>
#include <mutex>
#include <utility>

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

}  // namespace rlm::docker
