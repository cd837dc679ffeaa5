// The namespace backend: the payload runs under rlm-sandbox-init as PID 1 of fresh user, PID,
// mount, network, IPC, UTS and cgroup namespaces, on a root filesystem built from the policy,
// as an unprivileged uid, with capabilities dropped, no_new_privs, a seccomp filter, rlimits and
// a cgroup. docs/namespace-backend.md describes a run step by step.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"

namespace rlm::ns {

std::unique_ptr<Backend> make_namespace_backend();

class WarmSandbox;  // warm_sandbox.hpp

// For a Pool: whether `backend` is the namespace backend, the only one with warm sandboxes.
bool has_warm_sandboxes(const Backend& backend);
// A sandbox of `policy` built now by `backend` (the namespace backend), waiting for its payload.
// Throws Error when `backend` has none, or saying why the sandbox could not be built.
std::unique_ptr<WarmSandbox> build_warm_sandbox(const Backend& backend, const Policy& policy);

}  // namespace rlm::ns
