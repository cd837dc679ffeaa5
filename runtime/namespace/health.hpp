// `rlm-sandbox health` for the namespace backend: whether this host can create its namespaces,
// where init is, whether seccomp compiles, how cgroups are set up, and what each policy field
// comes to here.
#pragma once

#include "rlm_sandbox/backend.hpp"
#include "supervisor/init.hpp"

namespace rlm::ns {

// `init`: where the backend found rlm-sandbox-init.
Health namespace_health(const supervisor::InitLocation& init);
// Why no run can start here, or "" when one can: what selection asks before every run
// (Backend::unavailable_reason).
std::string namespace_unavailable_reason(const supervisor::InitLocation& init);

}  // namespace rlm::ns
