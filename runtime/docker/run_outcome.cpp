#include "docker/run_outcome.hpp"

#include <signal.h>
#include <string.h>

#include "rlm_sandbox/units.hpp"

namespace rlm::docker {
namespace {

std::string signal_name(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return "signal " + std::to_string(signal) +
         (abbreviation ? " (SIG" + std::string(abbreviation) + ")" : std::string());
}

std::string truncated_streams(const StreamOutcome& stream) {
  if (stream.stdout_truncated && stream.stderr_truncated) return "stdout and stderr";
  return stream.stdout_truncated ? "stdout" : "stderr";
}

// exit_code and signal as Docker reported them, whatever the status ends up being.
void fill_termination(Result& result, const Termination& termination) {
  result.exit_code = -1;
  result.signal = 0;
  if (!termination.exit_code) return;
  const int code = *termination.exit_code;
  if (code > 128 && code <= 128 + 64)
    result.signal = code - 128;
  else
    result.exit_code = code;
}

void classify_signal(Result& result, const Termination& termination, const Policy& policy) {
  const int signal = result.signal;
  const bool cpu_spent = result.cpu >= policy.limits.cpu_time;
  if (signal == SIGKILL && termination.oom_killed) {
    result.status = Status::memory_limit;
    result.detail = "memory limit " + format_size(policy.limits.memory_bytes) +
                    " exceeded (limits.memory_bytes): the kernel's OOM killer stopped a process "
                    "of the container";
  } else if (signal == SIGXCPU || (signal == SIGKILL && cpu_spent)) {
    result.status = Status::cpu_limit;
    result.detail = "CPU time limit " + format_duration(policy.limits.cpu_time) + " exceeded";
  } else if (signal == SIGSYS) {
    result.status = Status::seccomp_violation;
    result.detail = "killed by SIGSYS: a system call was denied by the seccomp profile";
  } else {
    result.status = Status::signaled;
    result.detail = "killed by " + signal_name(signal) + " (Docker reports it as exit status " +
                    std::to_string(128 + signal) + ")";
    if (signal == SIGXFSZ)
      result.detail += ": a file grew past the file size limit (limits.file_size_bytes)";
  }
}

}  // namespace

void fill_result(Result& result, StreamOutcome stream, const Termination& termination,
                 const CgroupReading& usage, const Policy& policy,
                 std::chrono::milliseconds wall_limit) {
  result.stdout_data = std::move(stream.stdout_data);
  result.stderr_data = std::move(stream.stderr_data);
  result.stdout_truncated = stream.stdout_truncated;
  result.stderr_truncated = stream.stderr_truncated;
  if (usage.peak_memory_bytes) result.peak_memory_bytes = *usage.peak_memory_bytes;
  if (usage.cpu_nanoseconds) result.cpu = std::chrono::microseconds(*usage.cpu_nanoseconds / 1000);
  fill_termination(result, termination);

  switch (stream.end) {
    case StreamEnd::deadline:
      result.status = Status::timeout;
      result.detail = "wall time limit " + format_duration(wall_limit) + " exceeded";
      return;
    case StreamEnd::output_limit:
      result.status = Status::output_limit;
      result.detail = truncated_streams(stream) + " exceeded the output limit of " +
                      format_size(policy.limits.output_bytes);
      return;
    case StreamEnd::cpu_limit: {
      // Stopped as a whole once its processes together had used the budget: reported as the
      // SIGXCPU death RLIMIT_CPU gives a single process.
      const auto budget =
          termination.cpu_budget.count() > 0 ? termination.cpu_budget : policy.limits.cpu_time;
      result.status = Status::cpu_limit;
      result.exit_code = -1;
      result.signal = SIGXCPU;
      result.detail =
          "CPU time limit " + format_duration(budget) +
          " exceeded (limits.cpu_time_ms): the container's processes together used " +
          format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(result.cpu)) +
          " of CPU time";
      return;
    }
    case StreamEnd::cancelled:
      result.status = Status::signaled;
      result.signal = SIGTERM;
      result.detail = "stopped by the caller";
      return;
    case StreamEnd::caller_error:
      result.status = Status::sandbox_error;
      result.detail = "stopped: an output callback threw";
      return;
    case StreamEnd::closed:
      break;
  }
  if (!stream.protocol_error.empty()) {
    result.status = Status::sandbox_error;
    result.detail = stream.protocol_error;
  } else if (!termination.exit_code) {
    result.status = Status::sandbox_error;
    result.detail = "the Docker daemon did not report how the payload ended";
  } else if (result.signal != 0) {
    classify_signal(result, termination, policy);
  } else if (result.exit_code == 0) {
    result.status = Status::ok;
  } else {
    result.status = Status::exit_nonzero;
    // Docker's init (tini) reports a command it cannot execute on stderr and exits 127 or 126.
    if ((result.exit_code == 127 || result.exit_code == 126) &&
        result.stderr_data.find("[FATAL tini") != std::string::npos)
      result.detail = "cannot execute the command: " +
                      result.stderr_data.substr(0, result.stderr_data.find('\n'));
  }
  if (termination.stopped_by_another)
    result.detail += std::string(result.detail.empty() ? "" : "; ") +
                     "the session's container was stopped because another execution on it hit "
                     "a limit";
}

}  // namespace rlm::docker
