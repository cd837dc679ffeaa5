// `rlm-sandbox health` for the docker backend: whether a daemon answers on its socket, whether
// its API is new enough, and what each policy field comes to under Docker.
#pragma once

#include "rlm_sandbox/backend.hpp"

namespace rlm::docker {

// Throws NeedsFullBinary in a build without the HTTP client (the static CLI re-executes its
// dynamically linked sibling then).
Health docker_health();
// Why no run can start here, or "" when one can; never throws. A successful daemon check is
// remembered, so selection before every run costs one connect() after the first.
std::string docker_unavailable_reason();

}  // namespace rlm::docker
