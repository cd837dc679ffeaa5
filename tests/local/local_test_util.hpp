// Shared helpers for the local backend tests: a permissive policy built in code (no policy files),
// one-call runs, and (from support/host_probes.hpp) what a run could leave behind.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "local/local_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "support/host_probes.hpp"

namespace rlm::test {

using namespace std::chrono_literals;

inline Policy local_policy() {
  Policy policy;
  policy.name = "local-test";
  policy.backend.prefer = {"local"};
  policy.backend.allow_unisolated = true;
  policy.limits.wall_time = 20s;
  policy.limits.cpu_time = 20s;
  policy.limits.memory_bytes = 1ull << 30;
  policy.filesystem.workdir = "";
  policy.env.clear = true;
  policy.env.set = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
  return policy;
}

inline Result run_local(const std::vector<std::string>& argv, const Policy& policy = local_policy(),
                        Request request = {}) {
  request.argv = argv;
  return local::make_local_backend()->run(request, policy);
}

inline Result run_sh(const std::string& script, const Policy& policy = local_policy(),
                     Request request = {}) {
  return run_local({"sh", "-c", script}, policy, std::move(request));
}

inline std::string describe(const Result& result) {
  return result.to_json().dump();
}

}  // namespace rlm::test
