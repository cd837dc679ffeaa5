#include "rlm_sandbox/request.hpp"

#include <unistd.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm {

HostIds caller_ids() {
  return {getuid(), getgid()};
}

std::vector<std::string> resolve_argv(const Request& request) {
  const bool has_code = !request.code.empty() || !request.language.empty();
  if (!request.argv.empty() && has_code)
    throw Error("a request gives either argv or code with a language, not both");
  if (!request.argv.empty()) return request.argv;
  if (!has_code) throw Error("a request needs argv, or code with a language");
  if (request.language == "python") return {"python3", "-c", request.code};
  if (request.language == "bash") return {"bash", "-c", request.code};
  if (request.language == "sh") return {"sh", "-c", request.code};
  throw Error("unknown language '" + request.language + "'; use python, bash or sh");
}

std::chrono::milliseconds effective_wall_time(const Request& request, const Policy& policy) {
  if (!request.timeout) return policy.limits.wall_time;
  if (*request.timeout <= std::chrono::milliseconds::zero())
    throw Error("a request timeout must be positive");
  if (*request.timeout > policy.limits.wall_time)
    throw Error("request timeout " + format_duration(*request.timeout) +
                " exceeds the policy's limits.wall_time_ms (" +
                format_duration(policy.limits.wall_time) +
                "); a request may only tighten a policy");
  return *request.timeout;
}

}  // namespace rlm
