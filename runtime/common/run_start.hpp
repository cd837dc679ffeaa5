// The opening and the ending every backend's run() shares: the request resolved before anything
// starts, the clock started, a Result labelled with the backend and the policy, and the wall time
// stamped on whatever Result the run hands back.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::common {

struct Supervision;
struct RunContext;

struct RunStart {
  using Clock = std::chrono::steady_clock;

  // Throws Error for an invalid request; the clock starts only once the request is resolved.
  RunStart(std::string_view backend, const Request& request, const Policy& policy);

  std::vector<std::string> argv;  // the payload's: the caller moves it into init's command line
  std::chrono::milliseconds wall_limit;
  std::vector<std::string> environment;  // the payload's: the caller moves it into the launch
  Clock::time_point start;
  Result result;

  Clock::time_point deadline() const { return start + wall_limit; }

  // The run's last step: stamps the wall time and hands the result over (moved out, so call it
  // once, in the return).
  Result finish();

  // Finishes as a sandbox_error: the sandbox could not be set up, for `detail`'s reason.
  Result setup_failed(std::string detail);

  // For backends that supervise rlm-sandbox-init: rethrows what the caller's output callbacks
  // threw (cleanup is done by then), else fills the result from what supervision saw. Leaves the
  // wall time to finish().
  void fill_from(Supervision supervision, const RunContext& context);
};

}  // namespace rlm::common
