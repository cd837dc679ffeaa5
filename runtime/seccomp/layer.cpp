// The mandatory preamble and how a policy's rules are layered on it. docs/seccomp.md explains
// every preamble rule and the layering rules enforced here.
#include <fcntl.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>

#include "seccomp/model.hpp"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

namespace rlm::seccomp::detail {
namespace {

constexpr Action kEperm{Verdict::errno_, EPERM};
// The kernel caps a filter's errno at MAX_ERRNO; larger values would not mean what they say.
constexpr int kMaxErrno = 4095;

// Argument positions on x86_64 and aarch64 (s390 would swap clone's first two).
constexpr unsigned kCloneFlagsArg = 0;
constexpr unsigned kIoctlRequestArg = 1;
constexpr unsigned kPersonaArg = 0;

// Syscalls the preamble denies for every call (EPERM).
constexpr std::string_view kDeniedSyscalls[] = {
    // namespaces and mounts: the sandbox's own isolation must stay as built
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr",
    // large kernel attack surface with no use in a sandboxed payload
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register",
    // reaching into other processes (rlm-sandbox-init shares the sandbox)
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    // host administration
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "iopl",
    "ioperm", "swapon", "swapoff", "reboot", "acct", "lookup_dcookie", "quotactl", "quotactl_fd",
    // file handles bypass path-based access checks (the "shocker" escape)
    "name_to_handle_at", "open_by_handle_at"};

// Syscalls the preamble answers with ENOSYS, as a kernel without them would, so that callers
// take their fallback: clone3 (see build_preamble), and the mount-listing pair, whose callers fall
// back to /proc/self/mountinfo (the same view, through code with a long record).
// openat2 too: its mode lives in a struct seccomp cannot read (see the set-id rules below), and
// its callers (systemd, some runtimes) fall back to openat(2).
constexpr std::string_view kAbsentSyscalls[] = {"clone3", "statmount", "listmount", "openat2"};

// Set-uid and set-gid mode bits (EPERM). A file the payload makes in a read-write bind outlives the
// sandbox on the host, where the sandbox's MS_NOSUID no longer applies: set-uid, it would let
// whoever can run it become the sandbox's host uid -- the uid a later sandbox, another client's,
// may be given. Each call that sets a mode: its mode argument, and for open/openat only when they
// create (O_CREAT or O_TMPFILE). mkdir(2) needs no rule: the kernel keeps only the permission and
// sticky bits of its mode.
#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif
constexpr std::uint64_t kSetIdBits = S_ISUID | S_ISGID;
constexpr std::uint64_t kCreateFlags = O_CREAT | __O_TMPFILE;
struct ModeSyscall {
  std::string_view name;
  unsigned mode_arg;
  int flags_arg;  // -1: every call sets the mode
};
constexpr ModeSyscall kModeSyscalls[] = {
    {"chmod", 1, -1},     {"fchmod", 1, -1}, {"fchmodat", 2, -1},
    {"fchmodat2", 2, -1}, {"mknod", 1, -1},  {"mknodat", 2, -1},
    {"creat", 1, -1},     {"open", 2, 1},    {"openat", 3, 2}};
constexpr const char* kSetIdDenied = "set-uid or set-gid mode bits";

// The socket families a sandbox may create: those a network namespace isolates and programs
// need. Every other family fails with EAFNOSUPPORT, what libc callers expect of a kernel without
// it. docs/seccomp.md justifies the list.
constexpr std::uint32_t kAllowedFamilies[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
constexpr unsigned kSocketDomainArg = 0;
constexpr const char* kFamiliesDenied =
    "families other than AF_UNIX, AF_INET, AF_INET6, AF_NETLINK";

constexpr std::uint64_t kNamespaceFlags[] = {CLONE_NEWNS,     CLONE_NEWUTS, CLONE_NEWIPC,
                                             CLONE_NEWUSER,   CLONE_NEWPID, CLONE_NEWNET,
                                             CLONE_NEWCGROUP, CLONE_NEWTIME};

// The personas Docker's default profile allows; 0xffffffff only queries the current one.
constexpr std::uint32_t kAllowedPersonas[] = {PER_LINUX, PER_LINUX32, UNAME26,
                                              std::uint32_t{PER_LINUX32} | UNAME26, 0xffffffffu};

constexpr const char* kPersonasDenied =
    "personas other than 0x0, 0x8, 0x20000, 0x20008 and the 0xffffffff query";

constexpr std::uint32_t kDeniedIoctls[] = {TIOCSTI, TIOCLINUX};

struct PreambleEntry {
  std::string name;
  Action action;
  std::vector<Conditions> denied;  // {{}}: every call
  std::vector<Conditions> rest;    // exactly the calls `denied` leaves alone; empty if none
  std::string what;                // the denied calls, for messages
};

Comparison low32_is(unsigned arg, std::uint32_t value) {
  return {arg, SCMP_CMP_MASKED_EQ, 0xffffffffu, value};
}

Comparison bits_set(unsigned arg, std::uint64_t bits) {
  return {arg, SCMP_CMP_MASKED_EQ, bits, bits};
}

Comparison bits_clear(unsigned arg, std::uint64_t bits) {
  return {arg, SCMP_CMP_MASKED_EQ, bits, 0};
}

// A mode with a set-id bit, (for open/openat) in a call that creates: denied; the rest is exactly
// a mode without them, or a call that creates nothing.
PreambleEntry set_id_entry(const ModeSyscall& call) {
  PreambleEntry entry{std::string(call.name), kEperm, {}, {}, kSetIdDenied};
  for (const std::uint64_t bit : {std::uint64_t{S_ISUID}, std::uint64_t{S_ISGID}}) {
    if (call.flags_arg < 0) {
      entry.denied.push_back({bits_set(call.mode_arg, bit)});
      continue;
    }
    const auto flags = static_cast<unsigned>(call.flags_arg);
    for (const std::uint64_t create : {std::uint64_t{O_CREAT}, std::uint64_t{__O_TMPFILE}})
      entry.denied.push_back({bits_set(flags, create), bits_set(call.mode_arg, bit)});
  }
  entry.rest.push_back({bits_clear(call.mode_arg, kSetIdBits)});
  if (call.flags_arg >= 0)
    entry.rest.push_back({bits_clear(static_cast<unsigned>(call.flags_arg), kCreateFlags)});
  return entry;
}

std::vector<PreambleEntry> build_preamble() {
  std::vector<PreambleEntry> entries;
  for (const auto name : kDeniedSyscalls)
    entries.push_back({std::string(name), kEperm, {Conditions{}}, {}, "every call"});
  // clone3's flags live in a struct seccomp cannot read; ENOSYS makes libc fall back to clone(2),
  // whose flags it can.
  for (const auto name : kAbsentSyscalls)
    entries.push_back(
        {std::string(name), {Verdict::errno_, ENOSYS}, {Conditions{}}, {}, "every call"});

  PreambleEntry clone{"clone", kEperm, {}, {}, "namespace flags"};
  std::uint64_t all_flags = 0;
  for (const auto flag : kNamespaceFlags) {
    clone.denied.push_back({Comparison{kCloneFlagsArg, SCMP_CMP_MASKED_EQ, flag, flag}});
    all_flags |= flag;
  }
  clone.rest.push_back({Comparison{kCloneFlagsArg, SCMP_CMP_MASKED_EQ, all_flags, 0}});
  entries.push_back(std::move(clone));

  // ioctl's request is an unsigned int in the kernel: compare only the low half, or a payload
  // could dodge the check by setting upper bits the kernel then ignores.
  PreambleEntry ioctl{"ioctl", kEperm, {}, {}, "TIOCSTI and TIOCLINUX requests"};
  for (const auto request : kDeniedIoctls)
    ioctl.denied.push_back({low32_is(kIoctlRequestArg, request)});
  ioctl.rest = complement_low32(kIoctlRequestArg, kDeniedIoctls);
  entries.push_back(std::move(ioctl));

  // An allow-list: every persona except the harmless ones (same low-half reasoning as ioctl).
  PreambleEntry persona{"personality", kEperm, {}, {}, kPersonasDenied};
  persona.denied = complement_low32(kPersonaArg, kAllowedPersonas);
  for (const auto value : kAllowedPersonas) persona.rest.push_back({low32_is(kPersonaArg, value)});
  entries.push_back(std::move(persona));

  // An allow-list of socket families (the domain is an int: the low half again).
  for (const char* name : {"socket", "socketpair"}) {
    PreambleEntry family{name, {Verdict::errno_, EAFNOSUPPORT}, {}, {}, kFamiliesDenied};
    family.denied = complement_low32(kSocketDomainArg, kAllowedFamilies);
    for (const auto value : kAllowedFamilies)
      family.rest.push_back({low32_is(kSocketDomainArg, value)});
    entries.push_back(std::move(family));
  }

  for (const auto& call : kModeSyscalls) entries.push_back(set_id_entry(call));
  return entries;
}

const std::vector<PreambleEntry>& preamble() {
  static const std::vector<PreambleEntry> entries = build_preamble();
  return entries;
}

struct PolicyRule {
  Conditions conditions;
  Action action;
  std::string path;
};

struct SyscallRules {
  std::string name;
  std::vector<PolicyRule> rules;
};

std::string in_quotes(std::string_view name) {
  return "\"" + std::string(name) + "\"";
}

class Layering {
 public:
  Layering(const Seccomp& policy, std::vector<Diagnostic>& problems)
      : policy_(policy), problems_(problems) {}

  Filter run() {
    parse_default();
    for (std::size_t i = 0; i < policy_.syscalls.size(); ++i) parse_rule(i);
    for (auto& s : by_syscall_) check_consistent(s);
    for (const auto& entry : preamble()) layer_preamble(entry);
    for (const auto& s : by_syscall_)
      if (!claimed_.contains(s.name))
        for (const auto& r : s.rules) emit(s.name, r.conditions, r.action, r.path);

    std::erase_if(filter_.rules, [&](const Rule& r) { return r.action == filter_.default_action; });
    verify_unambiguous();
    return std::move(filter_);
  }

 private:
  void problem(std::string path, std::string message) {
    problems_.push_back({std::move(path), std::move(message)});
  }

  // A syscall's rules are emitted together, so a duplicate can only be among the last ones.
  void emit(const std::string& name, const Conditions& conditions, Action action,
            const std::string& origin) {
    for (auto r = filter_.rules.rbegin(); r != filter_.rules.rend() && r->syscall == name; ++r)
      if (r->conditions == conditions && r->action == action) return;
    filter_.rules.push_back({name, conditions, action, origin});
  }

  void parse_default() {
    const auto verdict = parse_verdict(policy_.default_action);
    if (!verdict) {
      problem("seccomp.defaultAction",
              "unknown action " + in_quotes(policy_.default_action) +
                  "; use SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS, SCMP_ACT_TRAP "
                  "or SCMP_ACT_LOG");
      filter_.default_action = kEperm;  // keep checking the rules against something
      return;
    }
    // Docker's default errno is EPERM too (its defaultErrnoRet is not modelled).
    filter_.default_action = {*verdict,
                              *verdict == Verdict::errno_ ? kEperm.errno_value : std::uint16_t{0}};
  }

  void parse_rule(std::size_t index) {
    const SeccompRule& rule = policy_.syscalls[index];
    const std::string path = "seccomp.syscalls[" + std::to_string(index) + "]";
    bool ok = true;

    Action action;
    if (const auto verdict = parse_verdict(rule.action)) {
      action.verdict = *verdict;
    } else {
      problem(path + ".action", "unknown action " + in_quotes(rule.action));
      ok = false;
    }
    if (ok && action.verdict == Verdict::errno_) {
      const int e = rule.errno_ret.value_or(EPERM);
      if (e < 0 || e > kMaxErrno) {
        problem(path + ".errnoRet",
                "errno " + std::to_string(e) + " is outside 0.." + std::to_string(kMaxErrno));
        ok = false;
      }
      action.errno_value = static_cast<std::uint16_t>(e);
    } else if (ok && rule.errno_ret) {
      problem(path + ".errnoRet",
              "only SCMP_ACT_ERRNO takes an errno; this rule is " + std::string(rule.action));
      ok = false;
    }

    Conditions conditions;
    for (std::size_t j = 0; j < rule.args.size(); ++j) {
      const SeccompArg& arg = rule.args[j];
      const std::string arg_path = path + ".args[" + std::to_string(j) + "]";
      const auto op = parse_op(arg.op);
      if (!op) {
        problem(arg_path + ".op", "unknown comparison " + in_quotes(arg.op));
        ok = false;
        continue;
      }
      if (arg.index > 5) {
        problem(arg_path + ".index",
                "syscalls have arguments 0..5, not " + std::to_string(arg.index));
        ok = false;
        continue;
      }
      const Comparison c{arg.index, *op, arg.value, arg.value_two};
      // Fuse comparisons of one argument: libseccomp accepts only one per argument and rule.
      const auto merged = conjoin(conditions, {c});
      if (merged.kind == Conjunction::never) {
        problem(arg_path, "contradicts an earlier comparison of argument " +
                              std::to_string(arg.index) + ", so the rule could never apply");
        ok = false;
      } else if (merged.kind == Conjunction::inexpressible) {
        problem(arg_path, "compares argument " + std::to_string(arg.index) +
                              " a second time in a way one libseccomp comparison cannot "
                              "express; split the rule into several rules");
        ok = false;
      } else {
        conditions = merged.result;
      }
    }
    for (const auto& c : conditions)
      if ((c.op == SCMP_CMP_LT && c.a == 0) || (c.op == SCMP_CMP_GT && c.a == ~0ull)) {
        problem(path + ".args", "compares argument " + std::to_string(c.arg) +
                                    " in a way no value satisfies, so the rule could never apply");
        ok = false;
      }

    if (rule.names.empty()) {
      problem(path + ".names", "lists no syscall");
      ok = false;
    }
    for (std::size_t j = 0; j < rule.names.size(); ++j) {
      const auto nr = resolve_syscall(rule.names[j]);
      if (!nr) {
        problem(path + ".names[" + std::to_string(j) + "]",
                "unknown syscall " + in_quotes(rule.names[j]));
        ok = false;
        continue;
      }
      if (!ok) continue;
      add_policy_rule(canonical_name(rule.names[j], *nr), {conditions, action, path});
    }
  }

  // One name per syscall number, so aliases meet in one place.
  static std::string canonical_name(const std::string& name, int nr) {
    return syscall_name_of(nr).value_or(name);
  }

  void add_policy_rule(const std::string& name, PolicyRule rule) {
    auto [it, inserted] = index_.try_emplace(name, by_syscall_.size());
    if (inserted) by_syscall_.push_back({name, {}});
    auto& rules = by_syscall_[it->second].rules;
    const bool duplicate = std::any_of(rules.begin(), rules.end(), [&](const PolicyRule& r) {
      return r.conditions == rule.conditions && r.action == rule.action;
    });
    if (!duplicate) rules.push_back(std::move(rule));
  }

  // The policy's own rules must not leave libseccomp a choice: it silently keeps an argument-less
  // rule over any other rule for the syscall, and picks among overlapping rules by its own
  // internal order.
  void check_consistent(SyscallRules& s) {
    const auto whole = std::find_if(s.rules.begin(), s.rules.end(),
                                    [](const PolicyRule& r) { return r.conditions.empty(); });
    if (whole != s.rules.end()) {
      for (const auto& r : s.rules)
        if (r.action != whole->action)
          problem(r.path, in_quotes(s.name) + " also has a rule without args at " + whole->path +
                              " (" + describe(whole->action) + "), which would override this " +
                              describe(r.action) + " rule; give them the same action");
      s.rules = {*whole};
      return;
    }
    for (std::size_t i = 0; i < s.rules.size(); ++i)
      for (std::size_t j = i + 1; j < s.rules.size(); ++j)
        if (s.rules[i].action != s.rules[j].action &&
            !disjoint(s.rules[i].conditions, s.rules[j].conditions))
          problem(s.rules[j].path,
                  "may match the same " + in_quotes(s.name) + " calls as " + s.rules[i].path +
                      " with a different action (" + describe(s.rules[j].action) + " vs " +
                      describe(s.rules[i].action) + "); make their args exclude each other");
  }

  void layer_preamble(const PreambleEntry& entry) {
    claimed_.insert(entry.name);
    std::vector<PolicyRule> rules;
    if (const auto it = index_.find(entry.name); it != index_.end())
      rules = by_syscall_[it->second].rules;

    if (entry.rest.empty()) {  // denied for every call
      Action action = entry.action;
      std::string origin = "preamble";
      for (const auto& r : rules) {
        if (!r.action.denies()) {
          problem(r.path, in_quotes(entry.name) + " is denied by the mandatory preamble (" +
                              describe(entry.action) + "); a policy cannot " +
                              (r.action.verdict == Verdict::log ? "log-and-allow" : "allow") +
                              " it");
        } else if (!r.conditions.empty()) {
          if (r.action != entry.action)
            problem(r.path, in_quotes(entry.name) +
                                " is denied for every call by the mandatory preamble (" +
                                describe(entry.action) +
                                "); a rule may replace that action only for every call, so "
                                "drop its args");
        } else {
          action = r.action;  // another denying action for every call
          origin = r.path;
        }
      }
      emit(entry.name, {}, action, origin);
      return;
    }

    // Denied for some argument values. check_consistent left an argument-less rule alone.
    const PolicyRule* whole =
        rules.size() == 1 && rules[0].conditions.empty() ? &rules[0] : nullptr;
    if (whole && whole->action.denies()) {  // denies every call: at least as strict
      emit(entry.name, {}, whole->action, whole->path);
      return;
    }
    for (const auto& d : entry.denied) emit(entry.name, d, entry.action, "preamble");
    if (whole) {
      for (const auto& q : entry.rest) emit(entry.name, q, whole->action, whole->path);
      return;
    }
    for (const auto& r : rules) {
      const bool clear =
          std::all_of(entry.denied.begin(), entry.denied.end(),
                      [&](const Conditions& d) { return disjoint(r.conditions, d); });
      if (clear || r.action == entry.action) {
        emit(entry.name, r.conditions, r.action, r.path);
        continue;
      }
      if (r.action.denies()) {
        problem(r.path, "may match " + in_quotes(entry.name) +
                            " calls the mandatory preamble denies (" + entry.what + ", " +
                            describe(entry.action) + ") with a different action (" +
                            describe(r.action) +
                            "); make its args exclude them, or drop its args to apply it to "
                            "every call");
        continue;
      }
      // An allowing rule applies to the calls the preamble leaves alone: narrow it to them.
      std::size_t pieces = 0;
      for (const auto& q : entry.rest) {
        const auto c = conjoin(r.conditions, q);
        if (c.kind == Conjunction::never) continue;
        if (c.kind == Conjunction::inexpressible) {
          problem(r.path, "cannot be narrowed to the " + in_quotes(entry.name) +
                              " calls the mandatory preamble leaves alone (it denies " +
                              entry.what +
                              "): libseccomp cannot combine its comparison with the preamble's; "
                              "compare that argument with SCMP_CMP_EQ or SCMP_CMP_MASKED_EQ");
          pieces = 1;  // reported
          break;
        }
        emit(entry.name, c.result, r.action, r.path);
        ++pieces;
      }
      if (pieces == 0)
        problem(r.path, "only matches " + in_quotes(entry.name) +
                            " calls the mandatory preamble denies (" + entry.what +
                            "), so it could never apply");
    }
  }

  // The invariant compile() and the Docker export rely on; a failure is a bug here, not in the
  // policy.
  void verify_unambiguous() const {
    if (!problems_.empty()) return;
    std::map<std::string, std::vector<const Rule*>> by_name;
    for (const auto& r : filter_.rules) by_name[r.syscall].push_back(&r);
    for (const auto& [name, rules] : by_name)
      for (std::size_t i = 0; i < rules.size(); ++i)
        for (std::size_t j = i + 1; j < rules.size(); ++j)
          if (rules[i]->action != rules[j]->action &&
              !disjoint(rules[i]->conditions, rules[j]->conditions))
            throw Error("internal error: seccomp rules for \"" + name + "\" from " +
                        rules[i]->origin + " and " + rules[j]->origin + " overlap");
  }

  const Seccomp& policy_;
  std::vector<Diagnostic>& problems_;
  Filter filter_;
  std::vector<SyscallRules> by_syscall_;
  std::map<std::string, std::size_t> index_;
  std::set<std::string> claimed_;
};

}  // namespace

Filter layer(const Seccomp& policy, std::vector<Diagnostic>& problems) {
  return Layering(policy, problems).run();
}

}  // namespace rlm::seccomp::detail
