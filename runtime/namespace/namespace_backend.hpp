// The namespace backend: the payload runs under rlm-sandbox-init as PID 1 of fresh user, PID,
// mount, network, IPC, UTS and cgroup namespaces, on a root filesystem built from the policy,
// as an unprivileged uid, with capabilities dropped, no_new_privs, a seccomp filter, rlimits and
// a cgroup. docs/namespace-backend.md describes a run step by step.
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"

namespace rlm::ns {

std::unique_ptr<Backend> make_namespace_backend();

}  // namespace rlm::ns
