// The host side of a run: the loop that pumps stdin, collects capped output, enforces the wall
// deadline and watches init until it exits, then drains and reaps. Shared by every backend that
// launches rlm-sandbox-init; how init was started (plain fork, clone3 into namespaces) does not
// matter here.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "process/child_failure.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "supervisor/launch.hpp"

namespace rlm::supervisor {

struct SupervisionOptions {
  std::chrono::steady_clock::time_point deadline;  // wall limit
  std::chrono::milliseconds grace{200};            // init's SIGTERM -> SIGKILL grace
  std::uint64_t output_cap = 1u << 20;             // per stream
  std::string_view stdin_data;
  int stdin_fd = -1;                                           // replaces stdin_data when >= 0
  std::function<void(std::string_view)> on_stdout, on_stderr;  // empty: keep the output
  // Asked every `watch_interval` while the payload runs; true stops it like a timeout
  // (StopReason::limit_reached), e.g. once the cgroup's process limit has been hit, so a fork
  // bomb does not spin until the wall limit.
  std::function<bool()> limit_reached;
  int stop_fd = -1;  // readable: stop like a timeout (StopReason::cancelled)
  std::chrono::milliseconds watch_interval{25};
  // Return as soon as init's report is complete (its line has ended: init writes it last, once
  // every other process is dead and reaped), without waiting for init's exit: the end of PID 1
  // tears down the sandbox's namespaces, milliseconds the Result does not need when a cgroup counts
  // the usage. `process` then keeps its pid, and the caller must reap it (BuiltSandbox's destructor
  // does). Without a report, supervision waits as usual.
  bool defer_reap = false;
};

// The options every backend derives from its request and policy: the deadline, the grace, the
// output cap, stdin and the output callbacks.
SupervisionOptions supervision_options(const Request& request, const Policy& policy,
                                       std::chrono::steady_clock::time_point deadline);

// Why the runtime stopped the payload early, if it did.
enum class StopReason { none, timeout, output_limit, limit_reached, caller_error, cancelled };

struct Supervision {
  StopReason stop = StopReason::none;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  std::string report;  // what init wrote on its report pipe (one JSON line, or nothing)
  // Without a report: the step at which the launch child failed before init's exec (unset when it
  // reached the exec, or for a backend whose own pipeline reports that).
  process::ChildFailure start_failure;
  bool reaped = false;       // false if the host reaped init behind our back (SIGCHLD ignored), or
                             // the reap was deferred (SupervisionOptions::defer_reap)
  int wait_status = 0;       // init's, from wait4
  rusage usage{};            // init plus every descendant it reaped: the whole tree
  bool init_killed = false;  // init did not stop within grace + 1s and was SIGKILLed
  std::exception_ptr caller_error;  // thrown by on_stdout/on_stderr; rethrow after cleanup
};

// Runs until init has exited, then drains the pipes and reaps init. Stops init (SIGTERM; init
// applies the grace) at the deadline, when a stream exceeds the cap, or when a callback throws;
// SIGKILLs it grace + 1s later if it is still there. Leaves `process` reaped (unless the reap was
// deferred) and its fds closed, also when an exception escapes.
Supervision supervise_init(InitProcess& process, SupervisionOptions options);

}  // namespace rlm::supervisor
