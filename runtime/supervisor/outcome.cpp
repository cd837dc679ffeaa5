#include "supervisor/outcome.hpp"

#include <signal.h>
#include <string.h>

#include "rlm_sandbox/units.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm::supervisor {
namespace {

std::string truncated_streams(const RunEnd& end) {
  if (end.stdout_truncated && end.stderr_truncated) return "stdout and stderr";
  return end.stdout_truncated ? "stdout" : "stderr";
}

std::string memory_limit_detail(const RunEnd& end) {
  return "memory limit " + format_size(end.memory_bytes) +
         " exceeded (limits.memory_bytes): the kernel's OOM killer stopped a process of the " +
         std::string(end.group_noun);
}

// The group's CPU time past its budget: every process together, as no rlimit counts it.
std::string group_cpu_detail(const RunEnd& end, std::chrono::microseconds used) {
  return "CPU time limit " + format_duration(end.cpu_budget) +
         " exceeded (limits.cpu_time_ms): the " + std::string(end.group_noun) +
         "'s processes together used " +
         format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(used)) +
         " of CPU time";
}

// Stopped as a whole once its processes together had used the budget: reported as the SIGXCPU
// death RLIMIT_CPU gives a single process (exit status 152 from the CLI), whatever signal the
// payload's processes saw.
void stopped_for_cpu_time(Result& result, const RunEnd& end) {
  result.status = Status::cpu_limit;
  result.exit_code = -1;
  result.signal = SIGXCPU;
  result.detail = group_cpu_detail(end, result.cpu);
}

void classify_signal(Result& result, const RunEnd& end) {
  const int signal = end.signal;
  // SIGKILL is RLIMIT_CPU's hard limit only if the budget was spent and init itself was not busy
  // killing the tree after someone else's SIGTERM.
  const bool cpu_spent = end.cpu_time.count() > 0 && end.payload_cpu >= end.cpu_time;
  if (end.account == GroupAccount::kills_only && signal == SIGKILL && end.oom_killed) {
    result.status = Status::memory_limit;
    result.detail = memory_limit_detail(end);
  } else if (signal == SIGXCPU || (signal == SIGKILL && cpu_spent && !end.terminated)) {
    result.status = Status::cpu_limit;
    result.detail = "CPU time limit " + format_duration(end.cpu_time) + " exceeded";
  } else if (signal == SIGSYS) {
    result.status = Status::seccomp_violation;
    result.detail =
        "killed by SIGSYS: a system call was denied by " + std::string(end.seccomp_rules);
  } else {
    result.status = Status::signaled;
    result.detail = "killed by " + signal_name(signal);
    if (!end.exit_status_reporter.empty())
      result.detail += " (" + std::string(end.exit_status_reporter) +
                       " reports it as exit status " + std::to_string(128 + signal) + ")";
    if (signal == SIGXFSZ)
      result.detail += ": a file grew past the file size limit (limits.file_size_bytes)";
    if (end.terminated)
      result.detail += end.terminated_by_payload
                           ? " (the payload sent SIGTERM to rlm-sandbox-init, which stopped the "
                             "sandbox)"
                           : " (rlm-sandbox-init was sent SIGTERM from outside)";
  }
}

void classify_ending(Result& result, const RunEnd& end) {
  if (end.seccomp_syscall >= 0) {
    // Init killed the tree on the filter's notification: the kill action the policy asked for,
    // reported as the SIGSYS death the kernel's own kill would have been, plus the syscall's name.
    result.status = Status::seccomp_violation;
    result.exit_code = -1;
    result.signal = SIGSYS;
    result.detail =
        "syscall " + seccomp::syscall_name(end.seccomp_syscall) + " denied by the seccomp policy";
    return;
  }
  switch (end.ending) {
    case Ending::setup_failed:
      result.status = Status::sandbox_error;
      result.detail = end.problem;
      return;
    case Ending::cannot_execute:
      result.status = Status::exit_nonzero;
      result.detail = end.command.empty() ? "cannot execute the command: " + end.problem
                                          : "cannot execute '" + end.command + "': " + end.problem;
      return;
    case Ending::signaled:
      classify_signal(result, end);
      return;
    case Ending::exited:
      result.status = result.exit_code == 0 ? Status::ok : Status::exit_nonzero;
      return;
  }
}

bool failed(Status status) {
  return status == Status::exit_nonzero || status == Status::signaled ||
         status == Status::timeout || status == Status::sandbox_error;
}

// What the group saw over the whole run. A payload that failed after the OOM killer struck is
// memory_limit; after the process limit refused a fork, pids_limit -- a fork bomb usually ends in
// its own errors or the timeout, and the limit is the real cause. Past the CPU budget it is
// cpu_limit when the runtime stopped it for that or it failed after spending it, unless the wall
// limit, the output limit, a seccomp kill, the OOM killer or a setup failure came first; a payload
// that finished cleanly within one look of the supervision loop after passing the budget stays ok.
void apply_group_account(Result& result, const RunEnd& end) {
  const bool cpu_spent = end.group_cpu && *end.group_cpu >= end.cpu_budget;
  if (end.oom_killed && failed(result.status)) {
    result.status = Status::memory_limit;
    result.detail = memory_limit_detail(end);
  } else if (cpu_spent &&
             (end.stop == Stop::cpu_time || result.status == Status::exit_nonzero ||
              result.status == Status::signaled || result.status == Status::cpu_limit)) {
    if (end.stop == Stop::cpu_time) {
      stopped_for_cpu_time(result, end);
    } else {
      result.status = Status::cpu_limit;
      result.detail = group_cpu_detail(end, result.cpu);
    }
  } else if (end.pids_limit_hit &&
             (end.stop == Stop::pids ||
              (failed(result.status) && result.status != Status::sandbox_error))) {
    result.status = Status::pids_limit;
    result.detail = "process limit " + std::to_string(end.pids) + " reached (limits.pids): the " +
                    std::string(end.group_noun) + " could not create more processes";
  }
}

}  // namespace

void set_limits(RunEnd& end, const Limits& limits, std::chrono::milliseconds wall_limit) {
  end.wall_limit = wall_limit;
  end.cpu_time = limits.cpu_time;
  end.cpu_budget = limits.cpu_time;
  end.memory_bytes = limits.memory_bytes;
  end.pids = limits.pids;
  end.output_cap = limits.output_bytes;
}

void classify(RunEnd end, Result& result) {
  result.stdout_data = std::move(end.stdout_data);
  result.stderr_data = std::move(end.stderr_data);
  result.stdout_truncated = end.stdout_truncated;
  result.stderr_truncated = end.stderr_truncated;
  result.cpu = end.group_cpu.value_or(end.tree_cpu);
  result.peak_memory_bytes = end.group_peak_memory.value_or(end.tree_peak_memory);
  result.exit_code = end.exit_code;
  result.signal = end.signal;
  result.detail.clear();

  switch (end.stop) {
    case Stop::timeout:
      result.status = Status::timeout;
      result.detail = "wall time limit " + format_duration(end.wall_limit) + " exceeded";
      break;
    case Stop::output_limit:
      result.status = Status::output_limit;
      result.detail =
          truncated_streams(end) + " exceeded the output limit of " + format_size(end.output_cap);
      break;
    case Stop::cancelled:
      result.status = Status::interrupted;
      result.signal = SIGTERM;
      result.detail = "stopped by the caller";
      break;
    case Stop::caller_error:
      result.status = Status::sandbox_error;
      result.detail = "stopped: an output callback threw";
      break;
    case Stop::cpu_time:
      if (end.account == GroupAccount::kills_only) {
        stopped_for_cpu_time(result, end);
        break;
      }
      classify_ending(result, end);
      break;
    case Stop::none:
    case Stop::pids:
      classify_ending(result, end);
      break;
  }
  if (end.init_killed)
    result.detail +=
        "; rlm-sandbox-init did not stop the payload within its grace and was killed "
        "(processes that left its process group may have survived)";
  if (end.account == GroupAccount::whole_run) apply_group_account(result, end);
}

std::string signal_name(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return "signal " + std::to_string(signal) +
         (abbreviation ? " (SIG" + std::string(abbreviation) + ")" : std::string());
}

void add_note(Result& result, std::string_view note) {
  if (!result.detail.empty()) result.detail += "; ";
  result.detail += note;
}

}  // namespace rlm::supervisor
