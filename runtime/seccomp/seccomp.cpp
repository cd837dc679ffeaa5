#include "seccomp/seccomp.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "rlm_sys/sys.hpp"
#include "seccomp/cache.hpp"
#include "seccomp/model.hpp"

namespace rlm::seccomp {
namespace {

using detail::Filter;

Filter layered(const Seccomp& policy_rules) {
  std::vector<Diagnostic> problems;
  Filter filter = detail::layer(policy_rules, problems);
  if (problems.empty()) return filter;
  std::string message = "seccomp rules cannot be compiled:";
  for (const auto& p : problems) message += "\n  " + p.to_string();
  throw Error(message);
}

// The Docker/OCI name of the native architecture; throws when the preamble does not know its
// argument layout.
std::string_view native_architecture() {
  switch (seccomp_arch_native()) {
    case SCMP_ARCH_X86_64:
      return "SCMP_ARCH_X86_64";
    case SCMP_ARCH_AARCH64:
      return "SCMP_ARCH_AARCH64";
    default:
      throw Error(
          "seccomp: this architecture is not supported (rlm-sandbox's seccomp preamble knows "
          "x86_64 and aarch64); use the docker or local backend");
  }
}

struct ContextDeleter {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};
using Context = std::unique_ptr<void, ContextDeleter>;

void check_rc(int rc, const std::string& what) {
  if (rc < 0) throw Error("seccomp: " + what + ": " + sys::errno_text(-rc));
}

Error system_failure(const std::string& what) {
  return Error("seccomp: " + what + ": " + sys::errno_text(errno));
}

// What the payload calls between installing the notify filter and running its own code; if the
// policy denied one of them, the payload would wait on a listener init does not have yet.
bool handover_allowed(const Seccomp& rules) {
  for (const char* name : {"sendmsg", "execve", "write", "exit_group"})
    if (!allows_every_call(rules, name)) return false;
  return true;
}

bool kills(const std::string& action) {
  return action.starts_with("SCMP_ACT_KILL");
}

// Whether the policy has a kill action for the notify program to replace (the preamble has none).
bool has_kill_actions(const Seccomp& rules) {
  if (kills(rules.default_action)) return true;
  for (const auto& rule : rules.syscalls)
    if (kills(rule.action)) return true;
  return false;
}

host::UniqueFd new_memfd() {
  host::UniqueFd fd(memfd_create("rlm-sandbox-seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw system_failure("memfd_create");
  return fd;
}

// Checks the program's size (1 to BPF_MAXINSNS instructions) and seals the memfd, so neither init
// nor anything else can change the program afterwards.
void seal(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw system_failure("fstat");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0 || size % sizeof(sock_filter) != 0)
    throw Error("seccomp: libseccomp exported a malformed filter of " + std::to_string(size) +
                " bytes");
  if (size / sizeof(sock_filter) > BPF_MAXINSNS)
    throw Error("seccomp: the filter has " + std::to_string(size / sizeof(sock_filter)) +
                " instructions, more than the kernel's limit of " + std::to_string(BPF_MAXINSNS) +
                "; use fewer rules (an allow-list with fewer argument checks)");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    throw system_failure("F_ADD_SEALS");
}

std::vector<sock_filter> read_program(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw system_failure("fstat");
  const auto size = static_cast<std::size_t>(st.st_size);
  std::vector<sock_filter> instructions(size / sizeof(sock_filter));
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = pread(fd, reinterpret_cast<char*>(instructions.data()) + done, size - done,
                            static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(std::string("seccomp: reading the filter back: ") +
                  (n < 0 ? sys::errno_text(errno) : "short read"));
    done += static_cast<std::size_t>(n);
  }
  return instructions;
}

// A run's own sealed memfd holding a cached program.
host::UniqueFd sealed_copy(const std::vector<sock_filter>& instructions) {
  host::UniqueFd fd = new_memfd();
  const auto* data = reinterpret_cast<const char*>(instructions.data());
  const std::size_t size = instructions.size() * sizeof(sock_filter);
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = write(fd.get(), data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw system_failure("writing the filter");
    done += static_cast<std::size_t>(n);
  }
  seal(fd.get());
  return fd;
}

// `filter` (unambiguous, as detail::layer makes it) to BPF for the native architecture.
SealedProgram compile_filter(const Filter& filter, const CompileOptions& options) {
  native_architecture();

  bool notifies = false;
  const auto action_value = [&](detail::Action action) -> std::uint32_t {
    if (options.kill_as_notify && action.verdict == detail::Verdict::kill_process) {
      notifies = true;
      return SCMP_ACT_NOTIFY;
    }
    return detail::to_libseccomp(action);
  };

  // seccomp_init adds only the native architecture; every other ABI (int 0x80 and x32 on
  // x86_64, AArch32 on aarch64) takes the bad-architecture action.
  Context ctx(seccomp_init(action_value(filter.default_action)));
  if (!ctx) throw Error("seccomp: seccomp_init failed");
  check_rc(seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
           "setting the bad-architecture action");
  // Init's payload child sets no_new_privs itself; the filter is never loaded through libseccomp.
  check_rc(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_NNP, 0), "clearing the NNP attribute");
  // A binary search over syscall numbers instead of a linear scan.
  check_rc(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2), "enabling optimization");

  for (const auto& rule : filter.rules) {
    const auto nr = detail::resolve_syscall(rule.syscall);
    if (!nr) throw Error("seccomp: unknown syscall \"" + rule.syscall + "\"");
    if (*nr < 0) continue;  // not a syscall of this architecture: nothing can call it
    std::vector<scmp_arg_cmp> args;
    for (const auto& c : rule.conditions) args.push_back({c.arg, c.op, c.a, c.b});
    // _exact: fail rather than let libseccomp rewrite the rule.
    check_rc(seccomp_rule_add_exact_array(ctx.get(), action_value(rule.action), *nr,
                                          static_cast<unsigned>(args.size()), args.data()),
             "adding the " + detail::describe(rule.action) + " rule for \"" + rule.syscall +
                 "\" (" + rule.origin + ")");
  }

  // libseccomp 2.5 exports BPF only to a file descriptor: straight into the memfd init reads.
  host::UniqueFd fd = new_memfd();
  check_rc(seccomp_export_bpf(ctx.get(), fd.get()), "exporting BPF");
  seal(fd.get());
  return {std::move(fd), notifies};
}

}  // namespace

SealedProgram compile_sealed(const Seccomp& policy_rules, const CompileOptions& options) {
  return compile_filter(layered(policy_rules), options);
}

Program compile_landlock_additions(const LandlockAdditions& additions) {
  const SealedProgram sealed =
      compile_filter(detail::landlock_additions(additions.network_none), {});
  return {read_program(sealed.fd.get()), false};
}

Program compile(const Seccomp& policy_rules, const CompileOptions& options) {
  const SealedProgram sealed = compile_sealed(policy_rules, options);
  Program program;
  program.notifies = sealed.notifies;
  program.instructions = read_program(sealed.fd.get());
  return program;
}

namespace {

PayloadFilter compile_payload_filter(const Seccomp& rules) {
  PayloadFilter filter;
  filter.kill = compile_sealed(rules).fd;
  if (!has_kill_actions(rules) || !handover_allowed(rules)) return filter;
  SealedProgram notify;
  try {
    notify = compile_sealed(rules, {.kill_as_notify = true});
  } catch (const Error&) {
    return filter;  // a libseccomp or kernel without SCMP_ACT_NOTIFY: kills stay anonymous
  }
  if (notify.notifies) filter.notify = std::move(notify.fd);
  return filter;
}

}  // namespace

PayloadFilter prepare_payload_filter(const Seccomp& rules) {
  // The programs depend on the rules alone: compiled once per distinct rules (cache.hpp).
  const std::string key = cache::program_key(rules);
  if (auto cached = cache::find(key)) {
    PayloadFilter filter;
    filter.kill = sealed_copy(cached->kill);
    if (!cached->notify.empty()) filter.notify = sealed_copy(cached->notify);
    return filter;
  }
  PayloadFilter filter = compile_payload_filter(rules);
  cache::Programs programs;
  programs.kill = read_program(filter.kill.get());
  if (filter.notify) programs.notify = read_program(filter.notify.get());
  cache::store(key, programs);
  return filter;
}

bool allows_every_call(const Seccomp& policy_rules, std::string_view syscall) {
  const Filter filter = layered(policy_rules);
  if (!detail::resolve_syscall(syscall)) return false;
  bool allowed = !filter.default_action.denies();
  for (const auto& rule : filter.rules) {
    if (rule.syscall != syscall) continue;
    if (rule.action.denies()) return false;
    if (rule.conditions.empty()) allowed = true;
  }
  return allowed;
}

nlohmann::json docker_profile(const Seccomp& policy_rules) {
  const Filter filter = layered(policy_rules);

  // One entry per distinct (action, args), naming every syscall it applies to, in first-seen
  // order: the preamble's argument-less denials become a single entry.
  nlohmann::json entries = nlohmann::json::array();
  std::vector<std::pair<const detail::Rule*, std::size_t>> groups;
  for (const auto& rule : filter.rules) {
    // Like compile(): the profile lists one architecture, and this one has no such syscall.
    if (detail::resolve_syscall(rule.syscall).value_or(-1) < 0) continue;
    const auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
      return g.first->action == rule.action && g.first->conditions == rule.conditions;
    });
    if (same != groups.end()) {
      entries[same->second]["names"].push_back(rule.syscall);
      continue;
    }
    nlohmann::json entry{{"names", {rule.syscall}}, {"action", detail::profile_name(rule.action)}};
    if (rule.action.verdict == detail::Verdict::errno_) entry["errnoRet"] = rule.action.errno_value;
    entry["args"] = nlohmann::json::array();
    for (const auto& c : rule.conditions)
      entry["args"].push_back(
          {{"index", c.arg}, {"value", c.a}, {"valueTwo", c.b}, {"op", detail::op_name(c.op)}});
    groups.emplace_back(&rule, entries.size());
    entries.push_back(std::move(entry));
  }

  nlohmann::json profile{{"defaultAction", detail::profile_name(filter.default_action)},
                         {"architectures", {native_architecture()}},
                         {"syscalls", std::move(entries)}};
  return profile;
}

std::vector<Diagnostic> check(const Seccomp& policy_rules) {
  // Only rules that layered without a problem were ever compiled, and so cached (for this very
  // executable and libseccomp: cache.hpp). A cached program spares the layering, which is most of
  // loading a policy; the run that follows then finds the program in memory.
  if (cache::find(cache::program_key(policy_rules))) return {};
  std::vector<Diagnostic> problems;
  detail::layer(policy_rules, problems);
  return problems;
}

std::string syscall_name(int number) {
  if (auto name = detail::syscall_name_of(number)) return *name;
  return "syscall " + std::to_string(number);
}

}  // namespace rlm::seccomp
