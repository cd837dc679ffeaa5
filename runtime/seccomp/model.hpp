// The seccomp compiler's internal model: actions, argument comparisons and the rule list that
// both the BPF compiler and the Docker export are generated from. Internal to runtime/seccomp
// (and its tests).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <seccomp.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::seccomp::detail {

// Seccomp outcomes in the kernel's precedence order: when filters are stacked, the later
// enumerator wins. KILL and KILL_THREAD are folded into kill_process (see parse_verdict).
enum class Verdict : std::uint8_t { allow, log, errno_, trap, kill_process };

struct Action {
  Verdict verdict = Verdict::allow;
  std::uint16_t errno_value = 0;  // errno_ only

  bool denies() const { return verdict >= Verdict::errno_; }
  friend bool operator==(const Action&, const Action&) = default;
};

// The value seccomp_init/seccomp_rule_add take.
std::uint32_t to_libseccomp(Action action);
// "SCMP_ACT_ERRNO" etc., as the Docker/OCI profile spells it (errno not included).
std::string_view profile_name(Action action);
// "SCMP_ACT_ERRNO(1)", for messages.
std::string describe(Action action);

// Parses a profile action name (the errno comes separately). KILL (libseccomp: kill thread) and
// KILL_THREAD become kill_process: a payload thread killed alone would leave the rest of the
// process running in an undefined state, and the runtime reports a seccomp kill as a violation of
// the whole run. nullopt for anything else (TRACE, NOTIFY, typos).
std::optional<Verdict> parse_verdict(std::string_view name);

// One comparison of a syscall argument, in libseccomp/OCI terms: for SCMP_CMP_MASKED_EQ `a` is
// the mask and `b` the datum, and it holds when (arg & a) == (b & a); otherwise it compares the
// whole 64-bit argument with `a`, unsigned.
struct Comparison {
  unsigned arg = 0;
  scmp_compare op = SCMP_CMP_EQ;
  std::uint64_t a = 0;
  std::uint64_t b = 0;

  bool holds(std::uint64_t value) const;
  friend bool operator==(const Comparison&, const Comparison&) = default;
};

std::optional<scmp_compare> parse_op(std::string_view name);
std::string_view op_name(scmp_compare op);

// A conjunction with at most one comparison per argument, sorted by argument: libseccomp rejects
// a rule that compares one argument twice. Empty means "every call".
using Conditions = std::vector<Comparison>;

// The conjunction of two condition sets, when libseccomp can express it.
struct Conjunction {
  enum Kind { never, conditions, inexpressible } kind = never;
  Conditions result;  // kind == conditions
};
Conjunction conjoin(const Conditions& x, const Conditions& y);

// True when no call can satisfy both: some argument has comparisons that exclude each other.
// False when they may overlap (including when that cannot be decided).
bool disjoint(const Conditions& x, const Conditions& y);

// Patterns covering exactly the 32-bit values of argument `arg` that are NOT in `values`, as
// pairwise disjoint MASKED_EQ comparisons on its low 32 bits: walking the binary trie of
// `values` from bit 31 down, every branch that leads to no value becomes one pattern. The upper
// half is ignored, as the kernel ignores it for `int`/`unsigned int` arguments.
std::vector<Conditions> complement_low32(unsigned arg, std::span<const std::uint32_t> values);

// One rule of the final filter.
struct Rule {
  std::string syscall;    // as libseccomp names it
  Conditions conditions;  // empty: every call of the syscall
  Action action;
  std::string origin;  // "preamble" or the policy path it came from, for messages
};

// The preamble and the policy layered into one unambiguous rule list: for any syscall, two rules
// with different actions never match the same call, so the result does not depend on the order in
// which libseccomp (ours, or runc's for Docker) evaluates them. No rule has the default action.
struct Filter {
  Action default_action;
  std::vector<Rule> rules;
};

// Layers the mandatory preamble and `policy`; every problem goes to `problems` (paths like
// "seccomp.syscalls[2].names[0]"), and the returned filter is only meaningful when there are none.
Filter layer(const Seccomp& policy, std::vector<Diagnostic>& problems);

// The landlock backend's filter (landlock_additions.cpp): always ptrace, process_vm_*,
// pidfd_getfd and io_uring denied; under network "none" also SysV IPC and POSIX message queues,
// and every AF_INET/AF_INET6 socket (Landlock's TCP rule leaves TCP Fast Open and listen's
// implicit bind open). Its default allows: it is stacked with the policy's filter.
Filter landlock_additions(bool network_none);

// The native syscall number of `name` (negative when libseccomp knows the name but this
// architecture has no such syscall), or nullopt when the name is unknown. Syscalls newer than the
// libseccomp in use (2.5.4 on Debian 12 stops at futex_requeue) are known from a table of their
// numbers, which are the same on every architecture from 424 on.
std::optional<int> resolve_syscall(std::string_view name);

// The name of native syscall `number` (from libseccomp, or that table); nullopt when unknown.
std::optional<std::string> syscall_name_of(int number);

}  // namespace rlm::seccomp::detail
