#include "namespace/health.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <optional>

#include "cgroup/cgroup.hpp"
#include "host/sandbox_uid.hpp"
#include "namespace/child_setup.hpp"
#include "namespace/limits.hpp"
#include "namespace/probe.hpp"
#include "namespace/setup_signals.hpp"
#include "namespace/userns.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/self_readings.hpp"
#include "seccomp/seccomp.hpp"
#include "supervisor/health_fields.hpp"
#include "supervisor/init.hpp"

namespace rlm::ns {
namespace {

// Policy fields as the policy JSON names them. Memory, pids, the sandbox's CPU time and its CPU
// bandwidth depend on cgroups.
std::vector<std::string> always_enforced() {
  std::vector<std::string> fields = {
      "limits.wall_time_ms", "limits.kill_grace_ms",
      "limits.output_bytes", "limits.file_size_bytes",
      "limits.open_files",   "limits.tmpfs_bytes",
      "namespaces",
  };
  supervisor::append_sandbox_fields(fields);
  return fields;
}

// On a plain host selection only needs to know that user namespaces are not switched off; the
// sysctls say that without the cost of a probe sandbox in each CLI process. When they do not
// clearly allow it, or a container's signs are there (setup_signals.hpp), the real probe decides.
bool sysctls_allow_user_namespaces() {
  const auto read_number = [](const char* path) -> long {
    std::ifstream file(path);
    long value = -1;
    if (!(file >> value)) return -1;
    return value;
  };
  if (read_number("/proc/sys/user/max_user_namespaces") <= 0) return false;
  if (geteuid() == 0) return true;
  // Debian's and Ubuntu's switches for unprivileged creation (absent elsewhere).
  if (read_number("/proc/sys/kernel/unprivileged_userns_clone") == 0) return false;
  return read_number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") <= 0;
}

// Compiles the default filter the way a run does; throws Error. Remembered like the probe above.
void probe_seccomp_cached() {
  static std::atomic<bool> works{false};
  if (works.load()) return;
  seccomp::compile_sealed(Seccomp{});
  works.store(true);
}

// What is missing for any run at all, and how to get it.
struct Missing {
  std::string detail, fix;
};

// The real setup probe (probe.hpp): nothing when a sandbox could be built.
std::optional<Missing> probe_failure(const supervisor::InitLocation& init) {
  if (auto failure = probe_setup(init.path)) return Missing{failure->detail, failure->fix};
  return std::nullopt;
}

// What must hold for any run at all (a missing cgroup is a fallback, not unavailability): nothing
// when it does; cheap after the first call. `thorough` (health) probes for real; selection does
// so too wherever a cheap signal says a run's setup may be refused here -- a seccomp filter on the
// runtime, masked /proc, root without the capabilities it needs, a container -- or the sysctls do
// not clearly allow user namespaces, so that selection never contradicts health there. Where every
// signal is clear (a plain host), the cheap checks stand in for the probe.
std::optional<Missing> missing_prerequisite(const supervisor::InitLocation& init, bool thorough) {
  if (init.path.empty()) return Missing{init.problem(), supervisor::InitLocation::fix()};
  // A switch that forbids user namespaces outright: its own fix, whatever else would fail too.
  if (const std::string fix = user_namespace_fix();
      fix.starts_with("sysctl") && !sysctls_allow_user_namespaces())
    return Missing{"user namespaces are switched off on this host", fix};
  if (!thorough) {
    if (!sysctls_allow_user_namespaces() || read_setup_signals().any()) return probe_failure(init);
    // Selection skips the seccomp probe: the run compiles the policy's filter anyway.
    return std::nullopt;
  }
  // A root runtime gives each sandbox a host uid of the range; a malformed one fails every run
  // (with this message: selection still picks this backend, so the run says what to fix).
  if (geteuid() == 0) {
    try {
      sandbox_uid_range();
    } catch (const std::exception& error) {
      return Missing{
          error.what(),
          std::string("set ") + kUidRangeVariable +
              "=FIRST-LAST (unused host uids) in the runtime's environment, or unset it"};
    }
  }
  try {
    probe_seccomp_cached();
  } catch (const std::exception& error) {
    return Missing{error.what(),
                   "install libseccomp 2.5 or newer on x86_64 or aarch64, or use the docker "
                   "backend"};
  }
  return probe_failure(init);
}

// The four setups users run on (docs/cgroups.md, tests/lanes): who runs the runtime, and where
// its limits come from.
std::string host_setup(bool root, cgroup::CgroupSupport::Mode mode) {
  switch (mode) {
    case cgroup::CgroupSupport::Mode::v1:
      return root ? "root-cgroup-v1" : "user-cgroup-v1";
    case cgroup::CgroupSupport::Mode::v2:
      return root ? "root-cgroup-v2" : "user-delegated-cgroup-v2";
    case cgroup::CgroupSupport::Mode::none:
      break;
  }
  return root ? "root-no-cgroup" : "user-no-cgroup";
}

const char* mode_name(cgroup::CgroupSupport::Mode mode) {
  switch (mode) {
    case cgroup::CgroupSupport::Mode::v1:
      return "v1";
    case cgroup::CgroupSupport::Mode::v2:
      return "v2";
    case cgroup::CgroupSupport::Mode::none:
      break;
  }
  return "none";
}

}  // namespace

std::string namespace_unavailable_reason(const supervisor::InitLocation& init) {
  // The setup signals and container detection read the mount table once between them.
  const sys::SelfReadingScope readings;
  const auto missing = missing_prerequisite(init, /*thorough=*/false);
  if (!missing) return "";
  return missing->detail + (missing->fix.empty() ? "" : "; to fix: " + missing->fix);
}

Health namespace_health(const supervisor::InitLocation& init) {
  const sys::SelfReadingScope readings;  // as above
  Health health;
  health.backend = "namespace";
  health.isolated = true;

  const SetupSignals signals = read_setup_signals();
  const nlohmann::json container = {{"kind", host::container_name(signals.container.kind)},
                                    {"evidence", signals.container.evidence},
                                    {"signals", signals.describe()}};
  if (const auto missing = missing_prerequisite(init, /*thorough=*/true)) {
    health.detail = missing->detail;
    health.fix = missing->fix;
    health.host = {{"container", container}};
    return health;
  }

  health.available = true;
  const bool root = geteuid() == 0;
  const std::string uid_range = root ? sandbox_uid_range().describe() : "";
  health.detail =
      "user, PID, mount, network, IPC, UTS and cgroup namespaces; rlm-sandbox-init as PID 1 (" +
      init.path + "); the sandbox user mapped to " +
      (root ? "a host uid/gid of each live sandbox's own from " + uid_range +
                  " (runtime is root; " + kUidRangeVariable +
                  "), which owns its user namespace, so per-user kernel limits (inotify, fds in "
                  "flight, processes, message queues) are per sandbox"
            : "host uid " + std::to_string(geteuid()) +
                  " (rootless): every sandbox shares this uid's per-user kernel limits (inotify, "
                  "fds in flight, processes, message queues) with the others and with the caller; "
                  "each sandbox's own namespace caps it at half the inotify and fanotify "
                  "budgets") +
      "; capabilities dropped, no_new_privs, seccomp filter (denied syscalls named in the "
      "Result); " +
      LandlockPlan::describe_host();
  health.enforced = always_enforced();
  // An allowlist on the direct path; a pool's sandboxes refuse one (docs/network.md).
  health.network = {"none", "host", "allowlist"};
  const cgroup::CgroupSupport cgroups = cgroup::probe_cgroups();
  if (cgroups.mode != cgroup::CgroupSupport::Mode::none) {
    health.detail += "; " + cgroups.detail;
    health.enforced.insert(health.enforced.end(), cgroups.enforced.begin(), cgroups.enforced.end());
    for (const auto& [field, how] : cgroups.missing) health.fallbacks[field] = how;
  } else {
    health.detail += "; no usable cgroup (" + cgroups.detail + "), so rlimits stand in";
    health.fix = cgroups.fix;
    for (const auto& fallback : cgroup_limit_fallbacks()) {
      health.fallbacks[fallback.field] = fallback.how;
      if (fallback.enforced) health.enforced.push_back(fallback.field);
    }
  }
  for (const char* field :
       {"limits.memory_bytes", "limits.pids", "limits.cpu_time_ms", "limits.cpus"})
    if (std::find(health.enforced.begin(), health.enforced.end(), field) == health.enforced.end())
      health.unenforced.push_back(field);
  health.host = {{"setup", host_setup(root, cgroups.mode)}, {"cgroup", mode_name(cgroups.mode)},
                 {"cgroup_parents", cgroups.parents},       {"runtime_uid", geteuid()},
                 {"sandbox_uid_range", uid_range},          {"container", container}};
  return health;
}

}  // namespace rlm::ns
