// rlm::loosenings: every way a client's policy is looser than the one a server offers. Strict by
// design: what is not listed as a tightening below is refused, so a field added to Policy later
// is compared here or stays free only by a decision written down (env.set, workdir, hostname,
// description and name are the client's own business).
#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>

#include "policy/json_text.hpp"
#include "policy/network_rules.hpp"
#include "policy/tightening.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm {
namespace {

using policy::index_path;
using policy::key_path;

class Findings {
 public:
  void add(std::string path, std::string message) {
    found_.push_back(Diagnostic{std::move(path), std::move(message)});
  }
  std::vector<Diagnostic> take() { return std::move(found_); }

 private:
  std::vector<Diagnostic> found_;
};

// ---- limits --------------------------------------------------------------------------------

template <typename Value, typename Format>
void at_most(Findings& findings, std::string_view key, const Value& asked, const Value& offered,
             const Format& format) {
  if (asked > offered)
    findings.add(key_path("limits", key),
                 format(asked) + " is above the offered policy's " + format(offered));
}

void compare_limits(Findings& findings, const Limits& base, const Limits& candidate) {
  const auto size = [](std::uint64_t bytes) { return format_size(bytes); };
  const auto duration = [](std::chrono::milliseconds value) { return format_duration(value); };
  const auto count = [](std::uint32_t n) { return std::to_string(n); };
  at_most(findings, "wall_time_ms", candidate.wall_time, base.wall_time, duration);
  at_most(findings, "cpu_time_ms", candidate.cpu_time, base.cpu_time, duration);
  at_most(findings, "kill_grace_ms", candidate.kill_grace, base.kill_grace, duration);
  at_most(findings, "memory_bytes", candidate.memory_bytes, base.memory_bytes, size);
  at_most(findings, "output_bytes", candidate.output_bytes, base.output_bytes, size);
  at_most(findings, "file_size_bytes", candidate.file_size_bytes, base.file_size_bytes, size);
  at_most(findings, "tmpfs_bytes", candidate.tmpfs_bytes, base.tmpfs_bytes, size);
  at_most(findings, "session_buffer_bytes", candidate.session_buffer_bytes,
          base.session_buffer_bytes, size);
  at_most(findings, "pids", candidate.pids, base.pids, count);
  at_most(findings, "open_files", candidate.open_files, base.open_files, count);
  // nullopt is no bandwidth limit at all: any number is tighter, none is looser than a number.
  if (base.cpus) {
    if (!candidate.cpus)
      findings.add("limits.cpus", "no CPU limit is looser than the offered policy's " +
                                      format_cpus(*base.cpus) + " CPUs");
    else if (*candidate.cpus > *base.cpus)
      findings.add("limits.cpus", format_cpus(*candidate.cpus) +
                                      " CPUs is above the offered policy's " +
                                      format_cpus(*base.cpus));
  }
}

// ---- isolation switches --------------------------------------------------------------------

void compare_namespaces(Findings& findings, const Namespaces& base, const Namespaces& candidate) {
  const std::pair<std::string_view, bool Namespaces::*> kinds[] = {
      {"user", &Namespaces::user},    {"pid", &Namespaces::pid}, {"net", &Namespaces::net},
      {"mount", &Namespaces::mount},  {"ipc", &Namespaces::ipc}, {"uts", &Namespaces::uts},
      {"cgroup", &Namespaces::cgroup}};
  for (const auto& [name, member] : kinds)
    if (base.*member && !(candidate.*member))
      findings.add(key_path("namespaces", name),
                   "turned off; the offered policy isolates it (a client may only add namespaces)");
}

void compare_backend(Findings& findings, const BackendPreference& base,
                     const BackendPreference& candidate) {
  std::string offered;
  for (const auto& name : base.prefer) offered += (offered.empty() ? "" : ", ") + name;
  for (std::size_t i = 0; i < candidate.prefer.size(); ++i)
    if (std::find(base.prefer.begin(), base.prefer.end(), candidate.prefer[i]) == base.prefer.end())
      findings.add(
          index_path("backend.prefer", i),
          candidate.prefer[i] + " is not among the offered policy's backends (" + offered + ")");
  if (candidate.allow_unisolated && !base.allow_unisolated)
    findings.add("backend.allow_unisolated", "turned on; the offered policy never runs unisolated");
}

// none < an allowlist < host; an allowlist only narrows an allowlist (network_rules.hpp).
void compare_network(Findings& findings, const Policy& base, const Policy& candidate) {
  if (candidate.network == Network::none || base.network == Network::host) return;
  const std::string offered = std::string(to_string(base.network));
  if (candidate.network == Network::host) {
    findings.add("network", "host is not offered; the offered policy's network is " + offered);
    return;
  }
  if (base.network == Network::none) {
    findings.add("network", "an allowlist is looser than the offered policy's network, none");
    return;
  }
  const Egress& asked = candidate.egress;
  const Egress& given = base.egress;
  for (std::size_t i = 0; i < asked.allow.size(); ++i)
    if (!policy::covered_by_any(given.allow, asked.allow[i]))
      findings.add(index_path("network.allow", i),
                   asked.allow[i].text + " is not within the offered policy's allowlist");
  for (const auto& rule : given.deny)
    if (!policy::covered_by_any(asked.deny, rule))
      findings.add("network.deny", "drops the offered policy's deny entry " + rule.text);
  if (asked.allow_private && !given.allow_private)
    findings.add("network.private", "turned on; the offered policy refuses private addresses");
  for (std::size_t i = 0; i < asked.inject.size(); ++i) {
    const auto& injection = asked.inject[i];
    const bool offered_too =
        std::any_of(given.inject.begin(), given.inject.end(), [&](const auto& g) {
          return g.host == injection.host && g.header == injection.header &&
                 g.value_from_env == injection.value_from_env &&
                 g.value_from_file == injection.value_from_file;
        });
    if (!offered_too)
      findings.add(index_path("network.inject", i), "injects " + injection.header + " for " +
                                                        injection.host +
                                                        ", which the offered policy does not");
  }
  const auto above = [&](std::string_view key, auto asked_value, auto offered_value,
                         const std::string& asked_text, const std::string& offered_text) {
    if (asked_value > offered_value)
      findings.add(key_path("network.limits", key),
                   asked_text + " is above the offered policy's " + offered_text);
  };
  const auto& a = asked.limits;
  const auto& g = given.limits;
  above("connections", a.connections, g.connections, std::to_string(a.connections),
        std::to_string(g.connections));
  above("names", a.names, g.names, std::to_string(a.names), std::to_string(g.names));
  above("idle_ms", a.idle, g.idle, format_duration(a.idle), format_duration(g.idle));
  above("connection_bytes", a.connection_bytes, g.connection_bytes,
        std::to_string(a.connection_bytes), std::to_string(g.connection_bytes));
  above("client_hello_bytes", a.client_hello_bytes, g.client_hello_bytes,
        std::to_string(a.client_hello_bytes), std::to_string(g.client_hello_bytes));
  above("client_hello_wait_ms", a.client_hello_wait, g.client_hello_wait,
        format_duration(a.client_hello_wait), format_duration(g.client_hello_wait));
}

void compare_identity(Findings& findings, const Policy& base, const Policy& candidate) {
  compare_network(findings, base, candidate);
  for (std::size_t i = 0; i < candidate.capabilities.size(); ++i) {
    const auto& name = candidate.capabilities[i];
    if (std::find(base.capabilities.begin(), base.capabilities.end(), name) ==
        base.capabilities.end())
      findings.add(index_path("capabilities", i),
                   name + " is not among the offered policy's capabilities");
  }
  if (candidate.user.uid != base.user.uid)
    findings.add("user.uid", std::to_string(candidate.user.uid) +
                                 " differs from the offered policy's " +
                                 std::to_string(base.user.uid));
  if (candidate.user.gid != base.user.gid)
    findings.add("user.gid", std::to_string(candidate.user.gid) +
                                 " differs from the offered policy's " +
                                 std::to_string(base.user.gid));
  if (candidate.docker.image != base.docker.image)
    findings.add("docker.image", candidate.docker.image + " differs from the offered policy's " +
                                     base.docker.image);
}

// The server's environment is not the client's: a variable it passes through, or an environment
// left uncleared, would hand the client the server's own values.
void compare_env(Findings& findings, const Environment& base, const Environment& candidate) {
  if (!candidate.clear && base.clear)
    findings.add("env.clear",
                 "false would pass the server's whole environment; the offered policy clears it");
  for (std::size_t i = 0; i < candidate.pass.size(); ++i)
    if (std::find(base.pass.begin(), base.pass.end(), candidate.pass[i]) == base.pass.end())
      findings.add(index_path("env.pass", i),
                   candidate.pass[i] +
                       " is not passed by the offered policy; the server's environment is not "
                       "the client's");
}

// ---- seccomp -------------------------------------------------------------------------------

// How much an action refuses: a client may only move up. ALLOW and LOG let the call run; ERRNO
// and TRAP refuse it; KILL (libseccomp's KILL_THREAD) ends a thread; KILL_PROCESS the process.
int strictness(std::string_view action) {
  if (action == "SCMP_ACT_ERRNO" || action == "SCMP_ACT_TRAP") return 1;
  if (action == "SCMP_ACT_KILL" || action == "SCMP_ACT_KILL_THREAD") return 2;
  if (action == "SCMP_ACT_KILL_PROCESS") return 3;
  return 0;  // SCMP_ACT_ALLOW, SCMP_ACT_LOG, and anything unknown
}

bool same_rule(const SeccompRule& a, const SeccompRule& b) {
  if (a.names != b.names || a.action != b.action || a.args.size() != b.args.size()) return false;
  if (a.action == "SCMP_ACT_ERRNO" && a.errno_ret.value_or(1) != b.errno_ret.value_or(1))
    return false;
  for (std::size_t i = 0; i < a.args.size(); ++i) {
    const auto &x = a.args[i], &y = b.args[i];
    if (x.index != y.index || x.value != y.value || x.value_two != y.value_two || x.op != y.op)
      return false;
  }
  return true;
}

std::string describe(const SeccompRule& rule) {
  std::string names;
  for (const auto& name : rule.names) names += (names.empty() ? "" : ",") + name;
  return names + " -> " + rule.action + (rule.args.empty() ? "" : " (with argument conditions)");
}

void compare_seccomp(Findings& findings, const Seccomp& base, const Seccomp& candidate) {
  if (strictness(candidate.default_action) < strictness(base.default_action))
    findings.add(
        "seccomp.defaultAction",
        candidate.default_action + " is looser than the offered policy's " + base.default_action);
  // The offered rules must all be there, unchanged and in their order; whatever the candidate
  // adds around them must refuse the calls it names.
  std::vector<bool> kept(candidate.syscalls.size(), false);
  std::size_t next = 0;
  for (std::size_t j = 0; j < base.syscalls.size(); ++j) {
    std::size_t i = next;
    while (i < candidate.syscalls.size() && !same_rule(candidate.syscalls[i], base.syscalls[j]))
      ++i;
    if (i == candidate.syscalls.size()) {
      findings.add("seccomp.syscalls", "drops or changes the offered policy's rule " +
                                           index_path("seccomp.syscalls", j) + " (" +
                                           describe(base.syscalls[j]) +
                                           "); keep it unchanged and in its order");
      continue;
    }
    kept[i] = true;
    next = i + 1;
  }
  for (std::size_t i = 0; i < candidate.syscalls.size(); ++i)
    if (!kept[i] && strictness(candidate.syscalls[i].action) == 0)
      findings.add(key_path(index_path("seccomp.syscalls", i), "action"),
                   candidate.syscalls[i].action +
                       " in an added rule would let calls run; an added rule may only refuse "
                       "(SCMP_ACT_ERRNO, SCMP_ACT_TRAP, SCMP_ACT_KILL*)");
}

// ---- mounts --------------------------------------------------------------------------------

bool beneath(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // a trailing separator of dir
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

std::string mount_text(const Mount& mount) {
  if (mount.type == Mount::Type::tmpfs) return "tmpfs at " + mount.target;
  return "bind of " + mount.source + " at " + mount.target;
}

std::uint64_t tmpfs_size(const Mount& mount, const Limits& limits) {
  return mount.size_bytes.value_or(limits.tmpfs_bytes);
}

// Where `source` really is on the host: every symlink in it followed. An optional source that is
// missing resolves as far as it exists. nullopt (with the reason) when it cannot be resolved.
std::optional<std::filesystem::path> resolved_source(const Mount& mount, std::string& why) {
  std::error_code error;
  auto real = std::filesystem::canonical(mount.source, error);
  if (!error) return real;
  if (!mount.optional) {
    why = mount.source + " cannot be resolved on the host (" + error.message() +
          "); a bind that is not optional must exist";
    return std::nullopt;
  }
  real = std::filesystem::weakly_canonical(mount.source, error);
  if (error) {
    why = mount.source + " cannot be resolved on the host (" + error.message() + ")";
    return std::nullopt;
  }
  return real;
}

std::string permitted_text(const std::vector<PermittedBind>& permitted) {
  if (permitted.empty()) return "this client may bind no host directory";
  std::string text = "this client may bind beneath ";
  for (std::size_t i = 0; i < permitted.size(); ++i)
    text += (i ? ", " : "") + permitted[i].beneath + (permitted[i].writable ? " (read-write)" : "");
  return text;
}

struct Permission {
  bool beneath_any = false;  // `real` lies beneath a permitted directory
  bool writable = false;     // one of them permits read-write binds
};

Permission permission_for(const std::filesystem::path& real,
                          const std::vector<PermittedBind>& permitted) {
  Permission permission;
  for (const auto& entry : permitted) {
    if (entry.beneath.empty() || entry.beneath.front() != '/') continue;
    std::error_code error;
    const auto dir = std::filesystem::canonical(entry.beneath, error);
    if (error || !beneath(real, dir)) continue;
    permission.beneath_any = true;
    permission.writable = permission.writable || entry.writable;
  }
  return permission;
}

// A bind the base does not have: its real source must lie beneath a permitted directory (itself
// resolved), read-write only where that is permitted.
void check_new_bind(Findings& findings, const std::string& path, const Mount& mount,
                    const std::vector<PermittedBind>& permitted) {
  std::string why;
  const auto real = resolved_source(mount, why);
  if (!real) {
    findings.add(key_path(path, "source"), why);
    return;
  }
  const auto [beneath_any, writable] = permission_for(*real, permitted);
  const std::string resolved_note =
      real->string() == mount.source ? "" : " (resolved: " + real->string() + ")";
  if (!beneath_any)
    findings.add(key_path(path, "source"),
                 mount.source + resolved_note +
                     " is neither a mount of the offered policy nor beneath a directory the "
                     "server permits; " +
                     permitted_text(permitted));
  else if (!mount.readonly && !writable)
    findings.add(key_path(path, "readonly"), "false, but " + mount.source + resolved_note +
                                                 " may only be bound read-only; " +
                                                 permitted_text(permitted));
}

bool same_place(const Mount& a, const Mount& b) {
  return a.type == b.type && a.target == b.target &&
         (a.type == Mount::Type::tmpfs || a.source == b.source);
}

void compare_mounts(Findings& findings, const Policy& base, const Policy& candidate,
                    const std::vector<PermittedBind>& permitted) {
  const auto& offered = base.filesystem.mounts;
  const auto& asked = candidate.filesystem.mounts;
  std::vector<bool> offered_kept(offered.size(), false);
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const auto path = index_path("filesystem.mounts", i);
    const auto& mount = asked[i];
    const auto match = std::find_if(offered.begin(), offered.end(),
                                    [&](const Mount& m) { return same_place(m, mount); });
    if (match == offered.end()) {
      if (mount.type == Mount::Type::tmpfs)
        findings.add(path, mount_text(mount) +
                               " is not a mount of the offered policy; a client may only keep, "
                               "shrink or drop the offered tmpfs mounts");
      else
        check_new_bind(findings, path, mount, permitted);
      continue;
    }
    offered_kept[static_cast<std::size_t>(match - offered.begin())] = true;
    if (match->readonly && !mount.readonly)
      findings.add(key_path(path, "readonly"),
                   "false, but the offered policy mounts " + mount.target + " read-only");
    if (mount.type == Mount::Type::tmpfs &&
        tmpfs_size(mount, candidate.limits) > tmpfs_size(*match, base.limits))
      findings.add(key_path(path, "size"), format_size(tmpfs_size(mount, candidate.limits)) +
                                               " is above the offered policy's " +
                                               format_size(tmpfs_size(*match, base.limits)) +
                                               " for " + mount.target);
  }
  // A dropped mount that lay on or inside an earlier one the candidate keeps was hiding part of
  // it: dropping it would uncover what the offered policy hides.
  for (std::size_t j = 0; j < offered.size(); ++j) {
    if (offered_kept[j]) continue;
    for (std::size_t k = 0; k < j; ++k) {
      if (!offered_kept[k]) continue;
      const auto& outer = offered[k].target;
      if (offered[j].target == outer || offered[j].target.starts_with(outer + "/")) {
        findings.add("filesystem.mounts",
                     "drops the offered policy's " + index_path("filesystem.mounts", j) + " (" +
                         mount_text(offered[j]) + "), which hides part of the kept " +
                         mount_text(offered[k]) + "; keep it, or drop both");
        break;
      }
    }
  }
  if (candidate.filesystem.allow_kernel_interface_binds &&
      !base.filesystem.allow_kernel_interface_binds)
    findings.add("filesystem.allow_kernel_interface_binds",
                 "turned on; the offered policy never binds the host's kernel interfaces");
}

// ---- python ---------------------------------------------------------------------------------

// Each Python directory is a read-only bind: one the offered policy does not expose (itself or a
// directory above it) must lie, every symlink resolved, beneath a directory the server permits.
void compare_python(Findings& findings, const PythonEnvironment& base,
                    const PythonEnvironment& candidate,
                    const std::vector<PermittedBind>& permitted) {
  std::vector<std::filesystem::path> offered;
  for (const auto& dir : base.site_packages) offered.emplace_back(dir);
  if (base.venv) offered.emplace_back(*base.venv);
  for (auto& dir : offered) {
    std::error_code error;
    auto real = std::filesystem::canonical(dir, error);
    dir = error ? std::filesystem::path() : std::move(real);
  }
  const auto check = [&](const std::string& path, const std::string& dir) {
    Mount mount;
    mount.source = dir;
    std::string why;
    const auto real = resolved_source(mount, why);
    if (!real) {
      findings.add(path, why);
      return;
    }
    const bool exposed = std::any_of(offered.begin(), offered.end(), [&](const auto& o) {
      return !o.empty() && beneath(*real, o);
    });
    if (exposed || permission_for(*real, permitted).beneath_any) return;
    findings.add(path, dir + (real->string() == dir ? "" : " (resolved: " + real->string() + ")") +
                           " is not exposed by the offered policy nor beneath a directory the "
                           "server permits; " +
                           permitted_text(permitted));
  };
  if (candidate.venv) check("python.venv", *candidate.venv);
  for (std::size_t i = 0; i < candidate.site_packages.size(); ++i)
    check(index_path("python.site_packages", i), candidate.site_packages[i]);
}

}  // namespace

std::vector<Diagnostic> policy::limit_loosenings(const Limits& base, const Limits& candidate) {
  Findings findings;
  compare_limits(findings, base, candidate);
  return findings.take();
}

std::vector<Diagnostic> loosenings(const Policy& base, const Policy& candidate,
                                   const std::vector<PermittedBind>& permitted) {
  Findings findings;
  compare_backend(findings, base.backend, candidate.backend);
  compare_limits(findings, base.limits, candidate.limits);
  compare_namespaces(findings, base.namespaces, candidate.namespaces);
  compare_mounts(findings, base, candidate, permitted);
  compare_identity(findings, base, candidate);
  compare_seccomp(findings, base.seccomp, candidate.seccomp);
  compare_env(findings, base.env, candidate.env);
  compare_python(findings, base.python, candidate.python, permitted);
  return findings.take();
}

Policy narrow_network(Policy policy, const std::vector<std::string>& entries,
                      std::string_view source) {
  const std::string label(source);
  std::vector<NetworkRule> rules;
  std::vector<Diagnostic> malformed;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::string why;
    if (auto rule = policy::parse_network_rule(entries[i], false, why))
      rules.push_back(std::move(*rule));
    else
      malformed.push_back({index_path(label, i), entries[i] + ": " + why});
  }
  if (!malformed.empty()) throw PolicyError(label, std::move(malformed));
  if (policy.network == Network::none)
    throw Error(label + " " + (entries.empty() ? std::string() : entries.front()) +
                ": the policy's network is none; a run may only narrow its policy's network");
  if (policy.network == Network::allowlist)
    for (const auto& rule : rules)
      if (!policy::covered_by_any(policy.egress.allow, rule))
        throw Error(label + " " + rule.text +
                    ": not within the policy's allowlist; a run may only narrow it");
  // The policy's deny entries, private setting and limits stay; only what is allowed narrows.
  policy.network = Network::allowlist;
  policy.namespaces.net = true;
  policy.egress.allow = std::move(rules);
  std::erase_if(policy.egress.inject, [&](const NetworkInjection& injection) {
    std::string why;
    const auto host = policy::parse_network_rule(injection.host, false, why);
    return !host || !policy::covered_by_any(policy.egress.allow, *host);
  });
  return policy;
}

}  // namespace rlm
