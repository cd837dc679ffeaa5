// The opening and the ending every backend's run() shares: the request resolved before anything
// starts (its argv, wall limit and environment), the clock started, a Result labelled with the
// backend and the policy, how the run ended classified into it, and the wall time stamped on
// whatever Result the run hands back.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::supervisor {

struct InitProcess;
struct Supervision;
struct SupervisionOptions;
struct RunContext;
struct RunEnd;

// The payload's environment as a policy and a request define it: "NAME=value" strings, sorted by
// name: nothing (env.clear) or the host's environment, then the host's values of the env.pass
// names that are set, then env.set, then the request's variables. Throws Error for a name that
// is empty or holds '=' or NUL, or a value holding NUL. With `injections` (an allowlist's
// credentials), the variables they read are never set, whatever would have set them (env.clear
// false, env.pass, the request), and the TLS clients' trust variables point at
// kInjectionTrustBundle (after env.set, before the request's).
std::vector<std::string> payload_environment(const Environment& rules,
                                             const std::map<std::string, std::string>& request_env,
                                             const std::vector<NetworkInjection>& injections = {});

// Whether the request's payload has the caller's fds as its stdio (Request::payload_stdio). Throws
// Error when only some of the three are set, or when stdin_data, stdin_fd, on_stdout or on_stderr
// are set beside them.
bool uses_payload_stdio(const Request& request);

// Why `backend`, which has no way to enforce an egress allowlist (landlock, local), cannot run
// `policy`'s network as it asks, or "": a run never gets more network than its policy asks for,
// so such a policy is refused before anything starts.
std::string unenforceable_network(const Policy& policy, std::string_view backend);

struct RunStart {
  using Clock = std::chrono::steady_clock;

  // Throws Error for an invalid request (uses_payload_stdio included); the clock starts only once
  // the request is resolved. A backend that builds the sandbox first restarts it (`start`) when
  // the payload is released: the wall time is the payload's.
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

  // Classifies how the run ended into the result (supervisor/outcome.hpp). Leaves the wall time to
  // finish().
  void fill_from(RunEnd end);
  // For backends that supervise rlm-sandbox-init: rethrows what the caller's output callbacks
  // threw (cleanup is done by then), else fills the result from what supervision saw.
  void fill_from(Supervision supervision, const RunContext& context);
  // The end of a run whose sandbox has no live counters to offer (local, landlock): tells the
  // caller the payload started (request.on_started), supervises init until everything is gone,
  // and finishes.
  Result supervise_to_the_end(const Request& request, InitProcess& process,
                              SupervisionOptions options, const RunContext& context);
};

}  // namespace rlm::supervisor
