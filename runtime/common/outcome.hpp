// Turning what supervision saw (why the runtime stopped, init's report, init's rusage) into the
// Result every backend returns. One place decides the status taxonomy for init-based backends.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/supervise.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::common {

// What the mapping needs to know about the run besides the supervision itself.
struct RunContext {
  std::string argv0;    // the payload's command, for "cannot execute" messages
  std::string workdir;  // the directory init was told to enter ("" for none)
  std::string init_path;
  std::chrono::milliseconds wall_limit{0};
  std::chrono::milliseconds cpu_limit{0};  // what RLIMIT_CPU was derived from
  std::uint64_t output_cap = 0;
};

// `argv0` is the payload's command; `workdir` the directory init was told to enter.
RunContext run_context(const Policy& policy, std::string argv0, std::string workdir,
                       std::string init_path, std::chrono::milliseconds wall_limit);

// Fills status, exit_code, signal, detail, the output and its truncation flags, cpu and
// peak_memory_bytes. Leaves wall, backend and policy to the caller.
//
// Status, first match wins: the runtime stopped it (timeout, output_limit); init caught a seccomp
// violation through its notify listener (seccomp_violation, signal SIGSYS, the syscall named in
// detail); the sandbox could not be set up (sandbox_error); exec failed (exit_nonzero with
// 127/126); killed by SIGXCPU, or by SIGKILL after using its CPU budget (cpu_limit); by SIGSYS
// (seccomp_violation); by another signal (signaled); exit 0 (ok); another exit code
// (exit_nonzero).
void fill_result(Result& result, Supervision supervision, const RunContext& context);

}  // namespace rlm::common
