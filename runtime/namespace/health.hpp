// `rlm-sandbox health` for the namespace backend: whether this host can create its namespaces,
// where init is, whether seccomp compiles, how cgroups are set up, and what each policy field
// comes to here.
#pragma once

#include "rlm_sandbox/backend.hpp"

namespace rlm::ns {

Health namespace_health();
// Why no run can start here, or "" when one can: what selection asks before every run.
std::string namespace_unavailable_reason();

}  // namespace rlm::ns
