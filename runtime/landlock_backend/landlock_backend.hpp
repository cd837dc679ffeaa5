// The landlock backend: for hosts that refuse namespaces (Docker's default container, a restricted
// Kubernetes pod). The payload runs on the host's filesystem and process space, under
// rlm-sandbox-init, confined by Landlock (filesystem rights from the policy's mounts, TCP
// bind/connect denied under network "none", abstract unix sockets and signals scoped), seccomp
// (the policy's filter on the mandatory preamble, plus this backend's additions), rlimits,
// no_new_privs, no capabilities, and a host uid of its own when the runtime is root. What it cannot
// enforce is listed in health() and every Result's `unenforced`. Opt-in: a policy names it in
// backend.prefer, or the caller asks for it. docs/landlock-backend.md.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"

namespace rlm::landlock_backend {

std::unique_ptr<Backend> make_landlock_backend();

}  // namespace rlm::landlock_backend
