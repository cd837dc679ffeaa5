// The seccomp compiler: a policy's Docker/OCI-format seccomp block, layered on the mandatory
// preamble, compiled to classic BPF for the namespace backend or exported as a Docker profile.
// docs/seccomp.md describes the preamble and the layering rules.
//
// Using it from a backend: compile() in the parent (it allocates and calls libseccomp), then in
// the child, after every other setup step (mounts, capabilities, rlimits -- set RLIMIT_CORE to 0:
// a seccomp kill dumps core), call apply() as the last thing before execve. The policy must
// allow whatever the child calls between apply() and execve, and execve itself.
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/seccomp_profile.hpp"

namespace rlm::seccomp {

// A compiled classic-BPF filter for the native architecture.
struct Program {
  std::vector<sock_filter> instructions;
  bool notifies = false;  // holds SECCOMP_RET_USER_NOTIF actions (CompileOptions::kill_as_notify)
};

struct CompileOptions {
  // The policy's kill actions (SCMP_ACT_KILL, _KILL_PROCESS, _KILL_THREAD, in rules and as the
  // default) become SCMP_ACT_NOTIFY, so a supervisor holding the filter's listener learns which
  // syscall was denied, kills the payload itself and names the syscall. The denied call never runs
  // either way. Only for a filter installed with SECCOMP_FILTER_FLAG_NEW_LISTENER and a listener
  // that is read: without one the kernel fails those calls with ENOSYS instead of killing. The
  // preamble's own denials and the bad-architecture kill are unchanged.
  bool kill_as_notify = false;
};

// Layers `policy_rules` on the preamble and compiles them with libseccomp for the native
// architecture (x86_64 or aarch64; any other ABI kills the process). Throws rlm::Error listing
// every problem when the rules cannot be compiled exactly as written (see check()), and when the
// architecture is unsupported.
Program compile(const Seccomp& policy_rules, const CompileOptions& options = {});

// True when the layered filter allows every call of `syscall` (no rule denies any of its calls and
// the default, or an argument-less rule, allows it). For a supervisor that must make that syscall
// after installing the filter. False for names libseccomp does not know.
bool allows_every_call(const Seccomp& policy_rules, std::string_view syscall);

// Sets no_new_privs and installs `program` on the calling thread. Async-signal-safe: only
// prctl(2) and seccomp(2) through libc's thin syscall wrappers, no allocation, no libseccomp, so
// it may run between fork/clone and exec in a multithreaded host. Filters stack and cannot be
// removed. Returns 0, or -errno (-EINVAL for an empty or oversized program).
int apply(const Program& program) noexcept;

// docker_profile(): the same rules as a Docker profile, in the public
// rlm_sandbox/seccomp_profile.hpp.

// Every reason compile() would reject `policy_rules`, with JSON paths
// ("seccomp.syscalls[2].names[0]: ..."); empty when it compiles. For `policy check`.
std::vector<Diagnostic> check(const Seccomp& policy_rules);

// "ptrace" for the native syscall number, "syscall 999" when there is none (for Result.detail).
std::string syscall_name(int number);

}  // namespace rlm::seccomp
