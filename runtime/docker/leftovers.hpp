// Containers a crashed runtime left behind: every labelled container whose owner process is
// certainly gone (ownership.hpp) is removed, once per socket per process, before the first
// container this process makes. Containers of live owners, of owners in another PID namespace,
// and anything without our labels are never touched.
#pragma once

#include "docker/engine_api.hpp"

namespace rlm::docker {

// Removes them now; returns how many were removed. Best effort: never throws.
int collect_stale_containers(const EngineApi& api) noexcept;

// collect_stale_containers() on the first call per socket path in this process.
void collect_stale_containers_once(const EngineApi& api) noexcept;

}  // namespace rlm::docker
