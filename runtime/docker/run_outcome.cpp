#include "docker/run_outcome.hpp"

#include <signal.h>

#include "common/outcome.hpp"

namespace rlm::docker {
namespace {

common::Stop stop_of(StreamEnd end) {
  switch (end) {
    case StreamEnd::deadline:
      return common::Stop::timeout;
    case StreamEnd::output_limit:
      return common::Stop::output_limit;
    case StreamEnd::cpu_limit:
      return common::Stop::cpu_time;
    case StreamEnd::cancelled:
      return common::Stop::cancelled;
    case StreamEnd::caller_error:
      return common::Stop::caller_error;
    case StreamEnd::closed:
      break;
  }
  return common::Stop::none;
}

// How the payload ended, from what the stream and the daemon said.
void fill_ending(common::RunEnd& end, const StreamOutcome& stream, const Termination& termination) {
  using common::Ending;
  if (termination.exit_code) {
    const int code = *termination.exit_code;
    if (code > 128 && code <= 128 + 64)
      end.signal = code - 128;
    else
      end.exit_code = code;
  }
  if (!stream.protocol_error.empty()) {
    end.ending = Ending::setup_failed;
    end.problem = stream.protocol_error;
  } else if (!termination.exit_code) {
    end.ending = Ending::setup_failed;
    end.problem = "the Docker daemon did not report how the payload ended";
  } else if (end.signal != 0) {
    end.ending = Ending::signaled;
  } else if ((end.exit_code == 127 || end.exit_code == 126) &&
             end.stderr_data.find("[FATAL tini") != std::string::npos) {
    // Docker's init (tini) reports a command it cannot execute on stderr and exits 127 or 126.
    end.ending = Ending::cannot_execute;
    end.problem = end.stderr_data.substr(0, end.stderr_data.find('\n'));
  } else {
    end.ending = Ending::exited;
  }
}

}  // namespace

void fill_result(Result& result, StreamOutcome stream, const Termination& termination,
                 const CgroupReading& usage, const Policy& policy,
                 std::chrono::milliseconds wall_limit) {
  common::RunEnd end;
  common::set_limits(end, policy.limits, wall_limit);
  if (termination.cpu_budget.count() > 0) end.cpu_budget = termination.cpu_budget;
  end.stop = stop_of(stream.end);
  end.stdout_data = std::move(stream.stdout_data);
  end.stderr_data = std::move(stream.stderr_data);
  end.stdout_truncated = stream.stdout_truncated;
  end.stderr_truncated = stream.stderr_truncated;
  fill_ending(end, stream, termination);

  end.account = common::GroupAccount::kills_only;
  end.oom_killed = termination.oom_killed;
  if (usage.cpu_nanoseconds)
    end.group_cpu = std::chrono::microseconds(*usage.cpu_nanoseconds / 1000);
  end.group_peak_memory = usage.peak_memory_bytes;
  // RLIMIT_CPU counts per process, which Docker does not report: the container's total stands in.
  end.payload_cpu = end.group_cpu.value_or(std::chrono::microseconds(0));

  end.group_noun = "container";
  end.seccomp_rules = "the seccomp profile";
  end.exit_status_reporter = "Docker";
  common::classify(std::move(end), result);
  if (termination.stopped_by_another && stream.end == StreamEnd::closed)
    common::add_note(result,
                     "the session's container was stopped because another execution on it hit a "
                     "limit");
}

}  // namespace rlm::docker
