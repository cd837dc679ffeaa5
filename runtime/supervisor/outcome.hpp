// How a run ended, as every backend tells it, and the one classifier that turns that into the
// Result's status, exit code, signal and detail. A backend only fills a RunEnd: what the runtime
// stopped, how the payload ended, what the run's group (its cgroup, its container) saw, the output
// and the limits in force. Every status and every word of its detail is decided here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::supervisor {

// Why the runtime stopped the run before it ended by itself.
enum class Stop {
  none,
  timeout,       // the wall limit
  output_limit,  // stdout or stderr went past the cap
  cpu_time,      // the group's CPU time reached the budget
  pids,          // the group's process limit refused a fork
  cancelled,     // the caller asked (Request::stop_fd)
  caller_error,  // an output callback threw
};

// How the payload ended.
enum class Ending {
  exited,          // with `exit_code`
  signaled,        // killed by `signal`
  cannot_execute,  // its command could not be executed: `exit_code` 127 or 126, `problem` says why
  setup_failed,    // the sandbox itself failed: `problem` says how
};

// How far what the group saw reaches.
enum class GroupAccount {
  // The runtime's own cgroup, read once every process was gone (namespace backend): an OOM kill,
  // a refused fork or the CPU time spent explains a failed run, whatever ended it; a stop for the
  // CPU time or the process limit is confirmed by it.
  whole_run,
  // A container's state as its daemon reports it (docker backend): an OOM kill explains only a
  // death by SIGKILL, and a stop for the CPU time is final.
  kills_only,
};

struct RunEnd {
  Stop stop = Stop::none;

  // The payload: how its main process ended.
  Ending ending = Ending::setup_failed;
  int exit_code = -1;   // as it really was, whatever the status ends up being; -1 for none
  int signal = 0;       // the signal that killed it; 0 for none
  std::string problem;  // setup_failed, cannot_execute
  std::string command;  // cannot_execute: the command, "" when `problem` names it
  std::chrono::microseconds payload_cpu{0};  // what RLIMIT_CPU counted
  bool terminated = false;                   // init stopped the tree on a SIGTERM
  bool terminated_by_payload = false;        // ... which came from inside the sandbox
  int seccomp_syscall =
      -1;  // a notify-mode seccomp filter caught this syscall; init killed the tree
  bool init_killed = false;  // init did not stop the payload within its grace and was SIGKILLed

  // The group: every process of the run together.
  GroupAccount account = GroupAccount::whole_run;
  bool oom_killed = false;      // the kernel's OOM killer struck
  bool pids_limit_hit = false;  // the process limit refused a fork
  std::optional<std::chrono::microseconds> group_cpu;
  std::optional<std::uint64_t> group_peak_memory;
  // Without a group reading: what the processes init reaped used (CPU time, the largest one's
  // peak memory).
  std::chrono::microseconds tree_cpu{0};
  std::uint64_t tree_peak_memory = 0;

  // The output, as collected under the cap.
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;

  // The limits in force.
  std::chrono::milliseconds wall_limit{0};
  std::chrono::milliseconds cpu_time{0};    // limits.cpu_time_ms: what RLIMIT_CPU came from
  std::chrono::milliseconds cpu_budget{0};  // the group's CPU time (Request::sandbox_cpu_time)
  std::uint64_t memory_bytes = 0;
  std::uint32_t pids = 0;
  std::uint64_t output_cap = 0;

  // The words where backends differ.
  std::string_view group_noun = "sandbox";              // "container"
  std::string_view seccomp_rules = "a seccomp filter";  // "the seccomp profile"
  // Who reported a death by signal N as exit status 128+N ("Docker"); "" when it was seen as one.
  std::string_view exit_status_reporter;
};

// A policy's `limits` as a RunEnd holds them, with the run's own wall limit; the CPU budget is
// limits.cpu_time_ms until a backend that counts the group's CPU time says otherwise.
void set_limits(RunEnd& end, const Limits& limits, std::chrono::milliseconds wall_limit);

// Fills status, exit_code, signal, detail, the output and its truncation flags, cpu and
// peak_memory_bytes. Leaves wall, backend, policy and unenforced to the caller.
//
// Status, first match wins:
// 1. The runtime stopped it: timeout, output_limit; cancelled (signaled, SIGTERM); an output
//    callback threw (sandbox_error); the CPU time, where that stop is final (cpu_limit, SIGXCPU).
// 2. How the payload ended: init caught a seccomp violation through its notify listener
//    (seccomp_violation, SIGSYS, the syscall named); the sandbox could not be set up
//    (sandbox_error); its command could not be executed (exit_nonzero, 127 or 126); killed by
//    SIGKILL after an OOM kill the group can only tie to a kill (memory_limit); by SIGXCPU, or by
//    SIGKILL after using its CPU time (cpu_limit); by SIGSYS (seccomp_violation); by another signal
//    (signaled); exit 0 (ok); another exit code (exit_nonzero).
// 3. What the group saw over the whole run, overriding a failure: an OOM kill (memory_limit); the
//    group's CPU time past the budget when the runtime stopped it for that or the payload failed
//    (cpu_limit); a refused fork when the runtime stopped it for that or the payload failed
//    without a setup error (pids_limit).
void classify(RunEnd end, Result& result);

// "signal 9 (SIGKILL)"; "signal 42" for one without a name.
std::string signal_name(int signal);

// Appends "; `note`" to the result's detail ("`note`" when it is empty).
void add_note(Result& result, std::string_view note);

}  // namespace rlm::supervisor
