// `rlm-sandbox health` for the namespace backend: whether this host can create its namespaces,
// where init is, whether seccomp compiles, how cgroups are set up, and what each policy field
// comes to here.
#pragma once

#include "rlm_sandbox/backend.hpp"

namespace rlm::ns {

Health namespace_health();

}  // namespace rlm::ns
