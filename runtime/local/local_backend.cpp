// The local backend: the payload runs as a plain subprocess of the caller, under
// rlm-sandbox-init, with rlimits, a wall deadline and output caps -- and no isolation at all.
#include "local/local_backend.hpp"

#include <system_error>

#include "common/init.hpp"
#include "common/launch.hpp"
#include "common/rlimits.hpp"
#include "common/run_start.hpp"
#include "common/supervise.hpp"

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

common::InitSettings init_settings(const Policy& policy, const std::vector<std::string>& argv) {
  common::InitSettings settings;
  settings.grace = policy.limits.kill_grace;
  settings.rlimits = common::policy_rlimits(policy.limits);
  settings.workdir = policy.filesystem.workdir;  // "" = the caller's directory
  settings.payload_argv = argv;
  return settings;
}

class LocalBackend final : public Backend {
 public:
  std::string_view name() const override { return "local"; }
  bool isolated() const override { return false; }

  Health health() const override {
    Health health;
    health.backend = "local";
    health.isolated = false;
    health.enforced = kEnforced;
    health.unenforced = kUnenforced;
    health.fallbacks["limits.cpu_time_ms"] = kCpuTimeStandIn;
    const auto init = common::locate_init();
    health.available = !init.path.empty();
    if (health.available) {
      health.detail =
          "no isolation: runs the payload as a plain subprocess with the caller's user, files and "
          "network; enforces rlimits (CPU per process, address space as memory_bytes, file size, "
          "open files), the wall time and output caps, and kills every descendant (" +
          init.path + ")";
    } else {
      health.detail = init.problem();
      health.fix = common::InitLocation::fix();
    }
    return health;
  }

  Result run(const Request& request, const Policy& policy) override {
    // Prepare: an invalid request throws here, before anything starts.
    common::RunStart run("local", request, policy);
    // No isolation means no process or tmpfs cap and no CPU total: say so in every Result.
    run.result.unenforced = kUnenforcedLimits;
    if (policy.limits.cpus) run.result.unenforced.push_back("limits.cpus");

    const auto init = common::locate_init();
    if (init.path.empty())
      return run.setup_failed(init.problem() + "; to fix: " + common::InitLocation::fix());
    const auto settings = init_settings(policy, run.argv);
    // Built before the launch, so nothing that can throw sits between launch and supervision.
    auto options = common::supervision_options(request, policy, run.deadline());
    const auto context = common::run_context(policy, settings.payload_argv.front(),
                                             settings.workdir, init.path, run.wall_limit);

    // Launch.
    common::InitProcess process;
    try {
      process = common::launch_init(init.path, common::init_arguments(init.path, settings),
                                    std::move(run.environment), request.inherit_fds);
    } catch (const std::system_error& error) {
      return run.setup_failed(std::string("cannot start rlm-sandbox-init: ") + error.what());
    }
    if (request.on_started) request.on_started([] { return LiveCounters{}; });

    // Supervise until everything is gone, then finish.
    run.fill_from(common::supervise_init(process, std::move(options)), context);
    return run.finish();
  }
};

}  // namespace

std::unique_ptr<Backend> make_local_backend() {
  return std::make_unique<LocalBackend>();
}

}  // namespace rlm::local
