// The local backend: a plain subprocess with no isolation. Runs only under a policy that sets
// backend.allow_unisolated.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"

namespace rlm::local {

std::unique_ptr<Backend> make_local_backend();

}  // namespace rlm::local
