// The local backend: the payload runs as a plain subprocess of the caller, under
// rlm-sandbox-init, with rlimits, a wall deadline and output caps -- and no isolation at all.
#include "local/local_backend.hpp"

#include <system_error>

#include "supervisor/init.hpp"
#include "supervisor/launch.hpp"
#include "supervisor/rlimits.hpp"
#include "supervisor/run_start.hpp"
#include "supervisor/supervise.hpp"

namespace rlm::local {
namespace {

// Policy fields as the policy JSON names them, so health() speaks the policy's language.
const std::vector<std::string> kEnforced = {
    "limits.wall_time_ms",
    "limits.kill_grace_ms",
    "limits.memory_bytes",
    "limits.output_bytes",
    "limits.file_size_bytes",
    "limits.open_files",
    "env",
    "filesystem.workdir",
    "python",  // nothing to bind: the directories are the host's, named in RLM_SANDBOX_SITE_DIRS
};
const std::vector<std::string> kUnenforced = {
    "limits.pids",
    "limits.tmpfs_bytes",
    "limits.cpu_time_ms",
    "limits.cpus",
    "namespaces",
    "filesystem.mounts",
    "network",
    "seccomp",
    "capabilities",
    "user",
    "hostname",
};
// The limits among them, which every Result lists (limits.cpus only when the policy sets one).
const std::vector<std::string> kUnenforcedLimits = {"limits.pids", "limits.tmpfs_bytes",
                                                    "limits.cpu_time_ms"};
// What stands in, where something does.
constexpr const char* kCpuTimeStandIn =
    "RLIMIT_CPU per process: each process may use the whole budget, so a chain of short-lived "
    "processes is not bounded as a whole (no cgroup counts them together)";

supervisor::InitSettings init_settings(const Policy& policy, std::vector<std::string> argv) {
  supervisor::InitSettings settings;
  settings.grace = policy.limits.kill_grace;
  settings.rlimits = supervisor::policy_rlimits(policy.limits);
  settings.workdir = policy.filesystem.workdir;  // "" = the caller's directory
  settings.payload_argv = std::move(argv);
  return settings;
}

class LocalBackend final : public Backend {
 public:
  // Init is looked for once, when the backend is made: selection's availability check (health),
  // health itself and every run use what was found then.
  LocalBackend() : init_(supervisor::locate_init()) {}

  std::string_view name() const override { return "local"; }
  bool isolated() const override { return false; }

  Health health() const override {
    Health health;
    health.backend = "local";
    health.isolated = false;
    health.network = {"host"};
    health.enforced = kEnforced;
    health.unenforced = kUnenforced;
    health.fallbacks["limits.cpu_time_ms"] = kCpuTimeStandIn;
    health.available = !init_.path.empty();
    if (health.available) {
      health.detail =
          "no isolation: runs the payload as a plain subprocess with the caller's user, files and "
          "network; enforces rlimits (CPU per process, address space as memory_bytes, file size, "
          "open files), the wall time and output caps, and kills every descendant (" +
          init_.path + ")";
    } else {
      health.detail = init_.problem();
      health.fix = supervisor::InitLocation::fix();
    }
    return health;
  }

  Result run(const Request& request, const Policy& policy) override {
    // Prepare: an invalid request throws here, before anything starts.
    supervisor::RunStart run("local", request, policy);
    // No isolation means no process or tmpfs cap and no CPU total: say so in every Result.
    run.result.unenforced = kUnenforcedLimits;
    if (policy.limits.cpus) run.result.unenforced.push_back("limits.cpus");

    if (init_.path.empty())
      return run.setup_failed(init_.problem() + "; to fix: " + supervisor::InitLocation::fix());
    if (auto why = supervisor::unenforceable_network(policy, "local"); !why.empty())
      return run.setup_failed(why);
    // Built before the launch, so nothing that can throw sits between launch and supervision.
    auto options = supervisor::supervision_options(request, policy, run.deadline());
    const auto context = supervisor::run_context(
        policy, run.argv.front(), policy.filesystem.workdir, init_.path, run.wall_limit);
    auto settings = init_settings(policy, std::move(run.argv));

    // Launch.
    supervisor::InitProcess process;
    try {
      // The caller's fds as the payload's stdio (payload_stdio): they are init's, which the
      // payload inherits; no pipes pass through this process.
      supervisor::InitStdio stdio;
      if (supervisor::uses_payload_stdio(request))
        stdio = {supervisor::InitStdio::Kind::given, request.payload_stdio};
      process = supervisor::launch_init(init_.path,
                                        supervisor::init_arguments(init_.path, std::move(settings)),
                                        std::move(run.environment), request.inherit_fds, stdio);
    } catch (const std::system_error& error) {
      return run.setup_failed(std::string("cannot start rlm-sandbox-init: ") + error.what());
    }
    return run.supervise_to_the_end(request, process, std::move(options), context);
  }

 private:
  const supervisor::InitLocation init_;
};

}  // namespace

std::unique_ptr<Backend> make_local_backend() {
  return std::make_unique<LocalBackend>();
}

}  // namespace rlm::local
