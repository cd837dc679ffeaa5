// The docker backend: each run is a fresh container made from the policy (container_spec.hpp)
// through the Docker Engine API, attached before it starts, stopped at the wall deadline as a
// whole, and always removed. docs/docker-backend.md describes it.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"

namespace rlm::docker {

std::unique_ptr<Backend> make_docker_backend();

}  // namespace rlm::docker
