// What the daemon is: its version, its API version (checked against the one the backend pins),
// and the traits the policy mapping depends on. Asked once per socket per process.
#pragma once

#include <string>

#include "docker/container_spec.hpp"
#include "docker/engine_api.hpp"

namespace rlm::docker {

struct DaemonInfo {
  std::string version;      // "20.10.24"
  std::string api_version;  // "1.41"
  DaemonTraits traits;
};

// GET /version and GET /info, remembered per socket path once they succeeded. Throws DaemonError.
DaemonInfo daemon_info(const EngineApi& api);

// "" when `api_version` is at least kApiVersion; otherwise what to do about it.
std::string api_version_problem(const std::string& api_version, const std::string& version);

}  // namespace rlm::docker
