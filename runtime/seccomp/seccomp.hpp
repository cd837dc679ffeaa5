// The seccomp compiler: a policy's Docker/OCI-format seccomp block, layered on the mandatory
// preamble, compiled to classic BPF for the namespace backend or exported as a Docker profile.
// docs/seccomp.md describes the preamble and the layering rules.
//
// How a filter reaches the payload: prepare_payload_filter() in the parent (it allocates and calls
// libseccomp) compiles the policy straight into sealed memfds; rlm-sandbox-init receives them
// (--seccomp-fd, --seccomp-notify-fd), reads each once, and its payload child installs one with
// no_new_privs as its last step before execve, after every other setup step and rlimit (RLIMIT_CORE
// is 0: a seccomp kill dumps core) -- worker/init/seccomp_filter.cpp. The policy must allow what
// the child calls after installing it (sendmsg, to hand a listener to init) and execve itself.
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/seccomp_profile.hpp"

namespace rlm::seccomp {

// A compiled classic-BPF filter for the native architecture, in memory: what compile() gives to
// read and inspect it (tests, tools). A run never holds one: its programs go from libseccomp into a
// sealed memfd (SealedProgram) and from there into init.
struct Program {
  std::vector<sock_filter> instructions;
  bool notifies = false;  // holds SECCOMP_RET_USER_NOTIF actions (CompileOptions::kill_as_notify)
};

// The same program in a memfd sealed against every change (F_SEAL_SHRINK, _GROW, _WRITE, _SEAL),
// close-on-exec: at most BPF_MAXINSNS instructions, at least one.
struct SealedProgram {
  host::UniqueFd fd;
  bool notifies = false;
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
// architecture (x86_64 or aarch64; any other ABI kills the process) into a sealed memfd. Throws
// rlm::Error listing every problem when the rules cannot be compiled exactly as written (see
// check()), when the architecture is unsupported, the program is larger than the kernel takes, or
// a memfd cannot be made.
SealedProgram compile_sealed(const Seccomp& policy_rules, const CompileOptions& options = {});

// compile_sealed(), read back into memory. Throws like it.
Program compile(const Seccomp& policy_rules, const CompileOptions& options = {});

// The payload's programs as rlm-sandbox-init receives them.
struct PayloadFilter {
  host::UniqueFd kill;    // --seccomp-fd (always): the policy as written
  host::UniqueFd notify;  // --seccomp-notify-fd: its kill actions as user notifications, so init
                          // names the denied syscall; empty when the policy kills nothing, when
                          // it denies what the payload must call after installing it (sendmsg,
                          // execve, write, exit_group), or where libseccomp cannot notify
};

// Throws like compile_sealed().
PayloadFilter prepare_payload_filter(const Seccomp& rules);

// True when the layered filter allows every call of `syscall` (no rule denies any of its calls and
// the default, or an argument-less rule, allows it). For a supervisor that must make that syscall
// after installing the filter. False for names libseccomp does not know.
bool allows_every_call(const Seccomp& policy_rules, std::string_view syscall);

// The landlock backend's own filter, installed (no_new_privs set) before rlm-sandbox-init starts
// and so stacked beneath the policy's: see detail::landlock_additions for its rules. Throws like
// compile_sealed().
struct LandlockAdditions {
  bool network_none = true;  // the policy's network is "none"
};
Program compile_landlock_additions(const LandlockAdditions& additions);

// docker_profile(): the same rules as a Docker profile, in the public
// rlm_sandbox/seccomp_profile.hpp.

// Every reason compile() would reject `policy_rules`, with JSON paths
// ("seccomp.syscalls[2].names[0]: ..."); empty when it compiles. For `policy check`.
std::vector<Diagnostic> check(const Seccomp& policy_rules);

// "ptrace" for the native syscall number, "syscall 999" when there is none (for Result.detail).
std::string syscall_name(int number);

}  // namespace rlm::seccomp
