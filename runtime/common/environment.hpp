// The payload's environment as a policy and a request define it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::common {

// "NAME=value" strings, sorted by name: nothing (env.clear) or the host's environment, then the
// host's values of the env.pass names that are set, then env.set, then the request's variables.
// Throws Error for a name that is empty or holds '=' or NUL, or a value holding NUL.
std::vector<std::string> payload_environment(const Environment& rules,
                                             const std::map<std::string, std::string>& request_env);

}  // namespace rlm::common
