// A policy's seccomp rules, layered on the mandatory preamble, as a Docker seccomp profile: what
// `rlm-sandbox policy export --docker-seccomp` prints and the docker backend sends to the daemon.
#pragma once

#include <nlohmann/json.hpp>

#include "rlm_sandbox/policy.hpp"

namespace rlm::seccomp {

// The same layered rules the namespace backend compiles, as a Docker seccomp profile (for
// HostConfig.SecurityOpt "seccomp=<json>"): defaultAction, architectures (the native one only) and
// syscalls[] of {names, action, errnoRet (SCMP_ACT_ERRNO only), args[{index, value, valueTwo,
// op}]}. Throws rlm::Error for rules that would not compile.
nlohmann::json docker_profile(const Seccomp& policy_rules);

}  // namespace rlm::seccomp
