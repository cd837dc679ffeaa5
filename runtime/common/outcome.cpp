#include "common/outcome.hpp"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <cerrno>
#include <system_error>

#include "common/init_report.hpp"
#include "rlm_sandbox/units.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm::common {
namespace {

std::string describe_errno(int error) {
  return std::generic_category().message(error);
}

std::string signal_name(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return "signal " + std::to_string(signal) +
         (abbreviation ? " (SIG" + std::string(abbreviation) + ")" : std::string());
}

std::chrono::microseconds to_micro(const timeval& time) {
  return std::chrono::seconds(time.tv_sec) + std::chrono::microseconds(time.tv_usec);
}

std::string wait_status_text(const Supervision& supervision) {
  if (!supervision.reaped) return "its exit status was taken by another part of this process";
  const int status = supervision.wait_status;
  if (WIFSIGNALED(status)) return "killed by " + signal_name(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

std::string truncated_streams(const Supervision& supervision) {
  if (supervision.stdout_truncated && supervision.stderr_truncated) return "stdout and stderr";
  return supervision.stdout_truncated ? "stdout" : "stderr";
}

// Status and detail for a report that says the sandbox itself failed; "" detail when it did not.
std::string setup_problem(const InitReport& report, const RunContext& context,
                          const Supervision& supervision) {
  switch (report.kind) {
    case InitReport::Kind::setup_failed:
      if (report.step == "chdir")
        return "cannot enter the working directory '" + context.workdir +
               "': " + describe_errno(report.value);
      if (report.step == "seccomp")
        return "cannot install the seccomp filter in the payload: " + describe_errno(report.value);
      if (report.step == "guard")
        return "cannot guard the payload's signals (a seccomp listener: refused when already "
               "inside a sandbox that uses one, or on kernels before 5.0): " +
               describe_errno(report.value);
      return "cannot apply the " + report.path + " resource limit (" + report.step +
             "): " + describe_errno(report.value);
    case InitReport::Kind::init_failed:
      return "rlm-sandbox-init failed: " + report.message;
    case InitReport::Kind::init_exec_failed:
      return "cannot execute rlm-sandbox-init at " + context.init_path + ": " +
             describe_errno(report.value);
    case InitReport::Kind::missing:
      return "rlm-sandbox-init (" + context.init_path + ") ended without a report (" +
             wait_status_text(supervision) + ")";
    default:
      return "";
  }
}

// exit_code and signal as they really were, whatever the status ends up being.
void fill_termination(Result& result, const InitReport& report) {
  result.exit_code = -1;
  result.signal = 0;
  if (report.kind == InitReport::Kind::exited) result.exit_code = report.value;
  if (report.kind == InitReport::Kind::signaled) result.signal = report.value;
  if (report.kind == InitReport::Kind::exec_failed)
    result.exit_code = report.value == ENOENT ? 127 : 126;
}

void classify_signal(Result& result, const InitReport& report, const RunContext& context) {
  const int signal = report.value;
  // SIGKILL is RLIMIT_CPU's hard limit only if the budget was spent and init itself was not busy
  // killing the tree after someone else's SIGTERM.
  const bool cpu_spent = context.cpu_limit.count() > 0 && report.cpu >= context.cpu_limit;
  if (signal == SIGXCPU || (signal == SIGKILL && cpu_spent && !report.terminated)) {
    result.status = Status::cpu_limit;
    result.detail = "CPU time limit " + format_duration(context.cpu_limit) + " exceeded";
  } else if (signal == SIGSYS) {
    result.status = Status::seccomp_violation;
    result.detail = "killed by SIGSYS: a system call was denied by a seccomp filter";
  } else {
    result.status = Status::signaled;
    result.detail = "killed by " + signal_name(signal);
    if (signal == SIGXFSZ)
      result.detail += ": a file grew past the file size limit (limits.file_size_bytes)";
    if (report.terminated)
      result.detail += report.terminated_by_payload
                           ? " (the payload sent SIGTERM to rlm-sandbox-init, which stopped the "
                             "sandbox)"
                           : " (rlm-sandbox-init was sent SIGTERM from outside)";
  }
}

}  // namespace

RunContext run_context(const Policy& policy, std::string argv0, std::string workdir,
                       std::string init_path, std::chrono::milliseconds wall_limit) {
  RunContext context;
  context.argv0 = std::move(argv0);
  context.workdir = std::move(workdir);
  context.init_path = std::move(init_path);
  context.wall_limit = wall_limit;
  context.cpu_limit = policy.limits.cpu_time;
  context.output_cap = policy.limits.output_bytes;
  return context;
}

void fill_result(Result& result, Supervision supervision, const RunContext& context) {
  const InitReport report = parse_init_report(supervision.report);
  result.stdout_data = std::move(supervision.stdout_data);
  result.stderr_data = std::move(supervision.stderr_data);
  result.stdout_truncated = supervision.stdout_truncated;
  result.stderr_truncated = supervision.stderr_truncated;
  if (supervision.reaped) {
    // wait4 on init covers init and every descendant it reaped: the whole tree. ru_maxrss is the
    // largest single process, not a sum.
    result.cpu = to_micro(supervision.usage.ru_utime) + to_micro(supervision.usage.ru_stime);
    result.peak_memory_bytes = static_cast<std::uint64_t>(supervision.usage.ru_maxrss) * 1024;
  }
  fill_termination(result, report);

  const std::string problem = setup_problem(report, context, supervision);
  if (supervision.stop == StopReason::timeout) {
    result.status = Status::timeout;
    result.detail = "wall time limit " + format_duration(context.wall_limit) + " exceeded";
  } else if (supervision.stop == StopReason::output_limit) {
    result.status = Status::output_limit;
    result.detail = truncated_streams(supervision) + " exceeded the output limit of " +
                    format_size(context.output_cap);
  } else if (supervision.stop == StopReason::cancelled) {
    result.status = Status::signaled;
    result.signal = SIGTERM;
    result.detail = "stopped by the caller";
  } else if (supervision.stop == StopReason::caller_error) {
    result.status = Status::sandbox_error;
    result.detail = "stopped: an output callback threw";
  } else if (report.seccomp_syscall >= 0) {
    // Init killed the tree on the filter's notification: the kill action the policy asked for,
    // reported as the SIGSYS death the kernel's own kill would have been, plus the syscall's name.
    result.status = Status::seccomp_violation;
    result.exit_code = -1;
    result.signal = SIGSYS;
    result.detail = "syscall " + seccomp::syscall_name(report.seccomp_syscall) +
                    " denied by the seccomp policy";
  } else if (!problem.empty()) {
    result.status = Status::sandbox_error;
    result.detail = problem;
  } else if (report.kind == InitReport::Kind::exec_failed) {
    result.status = Status::exit_nonzero;
    result.detail = "cannot execute '" + context.argv0 + "': " + describe_errno(report.value);
  } else if (report.kind == InitReport::Kind::signaled) {
    classify_signal(result, report, context);
  } else {
    result.status = result.exit_code == 0 ? Status::ok : Status::exit_nonzero;
  }
  if (supervision.init_killed)
    result.detail +=
        "; rlm-sandbox-init did not stop the payload within its grace and was killed "
        "(processes that left its process group may have survived)";
}

}  // namespace rlm::common
