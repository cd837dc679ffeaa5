// The daemon as the docker backend sees it: what it is (its version, its API version, checked
// against the one the backend pins, and the traits the policy mapping depends on), and
// `rlm-sandbox health` for the backend: whether a daemon answers on its socket, whether its API is
// new enough, and what each policy field comes to under Docker.
#pragma once

#include <string>

#include "docker/container_spec.hpp"
#include "docker/engine_api.hpp"
#include "rlm_sandbox/backend.hpp"

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

// Throws NeedsFullBinary in a build without the HTTP client (the static CLI re-executes its
// dynamically linked sibling then).
Health docker_health();
// Why no run can start here, or "" when one can; never throws. A successful daemon check is
// remembered, so selection before every run costs one connect() after the first.
std::string docker_unavailable_reason();

}  // namespace rlm::docker
