// The docker backend: each run is a fresh container made from the policy (container_spec.hpp)
// through the Docker Engine API, attached before it starts, stopped at the wall deadline as a
// whole, and always removed. docs/docker-backend.md describes it.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::docker {

std::unique_ptr<Backend> make_docker_backend();

// What a Request may ask of the docker backend, checked before anything starts: throws
// NeedsFullBinary when this build has no HTTP client, and Error for request fields a container
// cannot honour (inherited file descriptors).
void require_runnable(const Request& request);

}  // namespace rlm::docker
