// The resource limits the local backend derives from a policy: setrlimit values, passed to
// rlm-sandbox-init as --rlimit NAME=SOFT:HARD.
#pragma once

#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::local {

// cpu: soft = the CPU time rounded up to whole seconds (SIGXCPU), hard = soft + 1 (SIGKILL, for a
// payload that handles SIGXCPU); as = memory_bytes; fsize = file_size_bytes; nofile = open_files;
// core = 0.
std::vector<std::string> rlimit_arguments(const Limits& limits);

}  // namespace rlm::local
