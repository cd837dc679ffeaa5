// Drives one hijacked attach connection on the caller's thread: feeds the payload's stdin
// (Request::stdin_data or stdin_fd, then a half-close so it sees EOF), splits the multiplexed
// output into stdout and stderr under the policy's per-stream cap, and stops at the wall deadline
// or when the caller's stop_fd (or the CPU watch's limit_fd) becomes readable. It never signals
// anything itself: what to stop and how is the caller's (a container's whole tree).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "docker/hijack.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::docker {

enum class StreamEnd {
  closed,        // the daemon ended the stream: the payload's stdout and stderr are closed
  deadline,      // the wall deadline came first
  output_limit,  // stdout or stderr went past the cap
  cancelled,     // the caller's stop_fd became readable
  cpu_limit,     // limit_fd became readable: the container used its CPU time
  caller_error,  // an output callback threw (StreamOutcome::caller_error)
};

struct StreamSettings {
  bool feeds_stdin = false;  // the connection carries the payload's stdin
  std::string_view stdin_data;
  int stdin_fd = -1;  // replaces stdin_data when >= 0; read until EOF, never closed
  std::uint64_t output_cap = 0;
  std::function<void(std::string_view)> on_stdout, on_stderr;  // else kept in the outcome
  std::chrono::steady_clock::time_point deadline;
  int stop_fd = -1;
  int limit_fd = -1;  // readable once the container's CPU time is spent (StatsSampler)
};

// The settings every docker run derives from its request and policy: stdin (fed when
// wants_stdin(request)), the output cap and callbacks, the stop fd, and `deadline`.
StreamSettings stream_settings(const Request& request, const Policy& policy,
                               std::chrono::steady_clock::time_point deadline);

struct StreamOutcome {
  StreamEnd end = StreamEnd::closed;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  std::exception_ptr caller_error;
  std::string protocol_error;  // the stream was not Docker's framing ("" when it was)
};

StreamOutcome pump_stream(HijackedConnection& connection, const StreamSettings& settings);

}  // namespace rlm::docker
