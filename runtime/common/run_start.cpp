#include "common/run_start.hpp"

#include <exception>
#include <utility>

#include "common/environment.hpp"
#include "common/outcome.hpp"
#include "common/supervise.hpp"

namespace rlm::common {

RunStart::RunStart(std::string_view backend, const Request& request, const Policy& policy)
    : argv(resolve_argv(request)),
      wall_limit(effective_wall_time(request, policy)),
      environment(payload_environment(policy.env, request.env)),
      start(Clock::now()) {
  result.backend = backend;
  result.policy = policy.name;
}

Result RunStart::finish() {
  result.wall = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  return std::move(result);
}

Result RunStart::setup_failed(std::string detail) {
  result.status = Status::sandbox_error;
  result.detail = std::move(detail);
  return finish();
}

void RunStart::fill_from(Supervision supervision, const RunContext& context) {
  if (supervision.caller_error) std::rethrow_exception(supervision.caller_error);
  fill_result(result, std::move(supervision), context);
}

}  // namespace rlm::common
