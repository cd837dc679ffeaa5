// The one classifier from how a run ended to a Result (runtime/supervisor/outcome.hpp), driven with
// the records each backend fills: the namespace backend's whole-run cgroup account, Docker's
// container state, and rlm-sandbox-init's report.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>

#include "supervisor/init.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/supervise.hpp"

namespace rlm::test {
namespace {

using std::chrono::milliseconds;
using supervisor::Ending;
using supervisor::GroupAccount;
using supervisor::RunEnd;
using supervisor::Stop;

RunEnd with_limits(GroupAccount account) {
  RunEnd end;
  Limits limits;  // wall 10s, CPU 10s, 256M, 64 processes, 1M of output
  supervisor::set_limits(end, limits, milliseconds(2'000));
  end.account = account;
  return end;
}

RunEnd container_end() {
  RunEnd end = with_limits(GroupAccount::kills_only);
  end.group_noun = "container";
  end.seccomp_rules = "the seccomp profile";
  end.exit_status_reporter = "Docker";
  return end;
}

Result classified(RunEnd end) {
  Result result;
  supervisor::classify(std::move(end), result);
  return result;
}

TEST(Outcome, TheSandboxsOomKillExplainsAnyFailure) {
  RunEnd end = with_limits(GroupAccount::whole_run);
  end.stop = Stop::timeout;
  end.ending = Ending::exited;
  end.exit_code = 1;
  end.oom_killed = true;
  end.group_peak_memory = 1234;
  end.tree_peak_memory = 99;
  const auto result = classified(end);
  EXPECT_EQ(result.status, Status::memory_limit);
  EXPECT_EQ(result.detail,
            "memory limit 256M exceeded (limits.memory_bytes): the kernel's OOM killer stopped a "
            "process of the sandbox");
  EXPECT_EQ(result.peak_memory_bytes, 1234u) << "the group's reading wins over rusage";

  end.stop = Stop::none;
  end.ending = Ending::exited;
  end.exit_code = 0;
  EXPECT_EQ(classified(end).status, Status::ok) << "a clean exit is not a failure";
}

TEST(Outcome, AContainersOomKillExplainsOnlyAKill) {
  RunEnd end = container_end();
  end.oom_killed = true;
  end.ending = Ending::exited;
  end.exit_code = 1;
  EXPECT_EQ(classified(end).status, Status::exit_nonzero);

  end.stop = Stop::timeout;
  EXPECT_EQ(classified(end).status, Status::timeout);

  end.stop = Stop::none;
  end.ending = Ending::signaled;
  end.exit_code = -1;
  end.signal = SIGKILL;
  const auto killed = classified(end);
  EXPECT_EQ(killed.status, Status::memory_limit);
  EXPECT_EQ(killed.detail,
            "memory limit 256M exceeded (limits.memory_bytes): the kernel's OOM killer stopped a "
            "process of the container");
  EXPECT_EQ(killed.signal, SIGKILL);
}

// Stopped by the runtime once the group had used its 500 ms budget; the payload died of `signal`.
RunEnd stopped_for_cpu(RunEnd end, int signal, std::chrono::microseconds used) {
  end.stop = Stop::cpu_time;
  end.ending = Ending::signaled;
  end.signal = signal;
  end.cpu_budget = milliseconds(500);
  end.group_cpu = used;
  return end;
}

TEST(Outcome, AStopForTheCpuTimeIsReportedAsSigxcpu) {
  const auto stopped =
      classified(stopped_for_cpu(container_end(), SIGKILL, std::chrono::microseconds(510'000)));
  EXPECT_EQ(stopped.status, Status::cpu_limit);
  EXPECT_EQ(stopped.signal, SIGXCPU);
  EXPECT_EQ(stopped.exit_code, -1);
  EXPECT_EQ(stopped.detail,
            "CPU time limit 500ms exceeded (limits.cpu_time_ms): the container's processes "
            "together used 510ms of CPU time");

  // The sandbox's stop is confirmed by its cgroup, and an OOM kill is the deeper cause.
  RunEnd sandbox = stopped_for_cpu(with_limits(GroupAccount::whole_run), SIGTERM,
                                   std::chrono::microseconds(600'000));
  sandbox.terminated = true;
  const auto confirmed = classified(sandbox);
  EXPECT_EQ(confirmed.status, Status::cpu_limit);
  EXPECT_EQ(confirmed.signal, SIGXCPU);
  EXPECT_EQ(confirmed.detail,
            "CPU time limit 500ms exceeded (limits.cpu_time_ms): the sandbox's processes together "
            "used 600ms of CPU time");
  sandbox.oom_killed = true;
  EXPECT_EQ(classified(sandbox).status, Status::memory_limit);
}

TEST(Outcome, ARefusedForkExplainsAFailureButNotASetupError) {
  RunEnd end = with_limits(GroupAccount::whole_run);
  end.pids_limit_hit = true;
  end.ending = Ending::exited;
  end.exit_code = 2;
  const auto failed = classified(end);
  EXPECT_EQ(failed.status, Status::pids_limit);
  EXPECT_EQ(failed.detail,
            "process limit 64 reached (limits.pids): the sandbox could not create more processes");

  end.ending = Ending::setup_failed;
  end.problem = "cannot enter the working directory '/x': No such file or directory";
  EXPECT_EQ(classified(end).detail, end.problem);

  end.stop = Stop::pids;
  EXPECT_EQ(classified(end).status, Status::pids_limit) << "the runtime stopped it for that";
}

TEST(Outcome, SignalsAreNamedInTheBackendsWords) {
  RunEnd sandbox = with_limits(GroupAccount::whole_run);
  sandbox.ending = Ending::signaled;
  sandbox.signal = SIGXFSZ;
  EXPECT_EQ(classified(sandbox).detail,
            "killed by signal 25 (SIGXFSZ): a file grew past the file size limit "
            "(limits.file_size_bytes)");
  sandbox.signal = SIGSEGV;
  sandbox.terminated = true;
  sandbox.terminated_by_payload = true;
  EXPECT_EQ(classified(sandbox).detail,
            "killed by signal 11 (SIGSEGV) (the payload sent SIGTERM to rlm-sandbox-init, which "
            "stopped the sandbox)");
  sandbox.signal = SIGSYS;
  EXPECT_EQ(classified(sandbox).detail,
            "killed by SIGSYS: a system call was denied by a seccomp filter");

  RunEnd container = container_end();
  container.ending = Ending::signaled;
  container.signal = SIGSEGV;
  EXPECT_EQ(classified(container).detail,
            "killed by signal 11 (SIGSEGV) (Docker reports it as exit status 139)");
  container.signal = SIGSYS;
  EXPECT_EQ(classified(container).detail,
            "killed by SIGSYS: a system call was denied by the seccomp profile");
}

TEST(Outcome, TheCallersStopAndTheOutputCapComeFirst) {
  RunEnd end = with_limits(GroupAccount::kills_only);
  end.ending = Ending::exited;
  end.exit_code = 0;
  end.stop = Stop::output_limit;
  end.stderr_truncated = true;
  EXPECT_EQ(classified(end).detail, "stderr exceeded the output limit of 1M");
  end.stop = Stop::cancelled;
  const auto cancelled = classified(end);
  EXPECT_EQ(cancelled.status, Status::interrupted);
  EXPECT_EQ(cancelled.signal, SIGTERM);
  EXPECT_EQ(cancelled.detail, "stopped by the caller");
  end.stop = Stop::timeout;
  EXPECT_EQ(classified(end).detail, "wall time limit 2s exceeded");
}

supervisor::Supervision supervised(std::string report, int wait_status = 0) {
  supervisor::Supervision supervision;
  supervision.report = std::move(report);
  supervision.reaped = true;
  supervision.wait_status = wait_status;
  supervision.usage.ru_utime = {1, 500'000};
  supervision.stdout_data = "out";
  return supervision;
}

TEST(Outcome, InitsReportBecomesTheRunEnd) {
  Policy policy;
  const auto context = supervisor::run_context(policy, "no-such-command", "/work",
                                               "/opt/rlm-sandbox-init", milliseconds(1'000));
  Result missing;
  supervisor::classify(
      supervisor::init_run_end(supervised(R"({"exec_errno":2,"path":"x"})"), context), missing);
  EXPECT_EQ(missing.status, Status::exit_nonzero);
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_EQ(missing.detail, "cannot execute 'no-such-command': No such file or directory");
  EXPECT_EQ(missing.stdout_data, "out");
  EXPECT_EQ(missing.cpu, std::chrono::microseconds(1'500'000)) << "init's rusage";

  Result chdir;
  supervisor::classify(
      supervisor::init_run_end(supervised(R"({"setup_errno":2,"step":"chdir","path":"/work"})"),
                               context),
      chdir);
  EXPECT_EQ(chdir.status, Status::sandbox_error);
  EXPECT_EQ(chdir.detail, "cannot enter the working directory '/work': No such file or directory");

  Result silent;
  supervisor::classify(supervisor::init_run_end(supervised("", 125 << 8), context), silent);
  EXPECT_EQ(silent.status, Status::sandbox_error);
  EXPECT_EQ(silent.detail,
            "rlm-sandbox-init (/opt/rlm-sandbox-init) ended without a report (exit status 125)");

  // No report, and the launch child's record says init's exec failed.
  auto not_started = supervised("", 125 << 8);  // kInitFailureExit
  not_started.start_failure.set("execve", EACCES);
  Result unexecutable;
  supervisor::classify(supervisor::init_run_end(not_started, context), unexecutable);
  EXPECT_EQ(unexecutable.status, Status::sandbox_error);
  EXPECT_EQ(unexecutable.detail,
            "cannot execute rlm-sandbox-init at /opt/rlm-sandbox-init: Permission denied");
  not_started.start_failure.set("dup2 (stdio and report pipe)", EBADF);
  Result no_stdio;
  supervisor::classify(supervisor::init_run_end(not_started, context), no_stdio);
  EXPECT_EQ(no_stdio.detail,
            "cannot start rlm-sandbox-init (dup2 (stdio and report pipe)): Bad file descriptor");

  Result caught;
  supervisor::classify(supervisor::init_run_end(supervised(R"({"signal":9,"seccomp_violation":)" +
                                                           std::to_string(SYS_ptrace) + "}"),
                                                context),
                       caught);
  EXPECT_EQ(caught.status, Status::seccomp_violation);
  EXPECT_EQ(caught.signal, SIGSYS);
  EXPECT_EQ(caught.detail, "syscall ptrace denied by the seccomp policy");
}

TEST(Outcome, NotesFollowTheDetail) {
  Result result;
  supervisor::add_note(result, "note: first");
  supervisor::add_note(result, "note: second");
  EXPECT_EQ(result.detail, "note: first; note: second");
}

}  // namespace
}  // namespace rlm::test
