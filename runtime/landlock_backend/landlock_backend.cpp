#include "landlock_backend/landlock_backend.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <system_error>

#include "host/sandbox_uid.hpp"
#include "landlock/landlock.hpp"
#include "landlock_backend/confinement.hpp"
#include "process/child_failure.hpp"
#include "process/child_start.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "seccomp/seccomp.hpp"
#include "supervisor/init.hpp"
#include "supervisor/launch.hpp"
#include "supervisor/rlimits.hpp"
#include "supervisor/run_start.hpp"
#include "supervisor/supervise.hpp"

namespace rlm::landlock_backend {
namespace {

using host::UniqueFd;

constexpr const char* kFix =
    "run on a kernel with Landlock (5.13 or later, CONFIG_SECURITY_LANDLOCK=y, \"landlock\" in the "
    "boot's lsm= list) where seccomp allows landlock_create_ruleset (Docker 23 and later do by "
    "default), or use the namespace backend";

// How long the parent waits for the child's confinement verdict: the child runs a handful of
// syscalls before exec; this only bounds a machine that stalls.
constexpr int kChildVerdictMs = 10'000;

// The properties and fields nothing here enforces, in the vocabulary of docs/policy.md.
const std::vector<std::string> kAlwaysUnenforced = {
    "isolation.pid",                 // host processes are visible in /proc (read is granted)
    "isolation.host_network_view",   // routes, sockets and /proc/net can be listed, not used
    "isolation.mount",               // the host's mount tree: bind targets are not remapped
    "isolation.private_tmp",         // /tmp is the host's; TMPDIR is the run's own directory
    "isolation.named_unix_sockets",  // connect() to a named socket is not a Landlock right
    "isolation.stat_outside_paths",  // stat, readlink and getattr are not Landlock rights
    "limits.memory_bytes",           // no total: RLIMIT_AS per process stands in
    "limits.cpu_time_ms",            // no total: RLIMIT_CPU per process stands in
    "limits.tmpfs_bytes",            // the run's directory is on the host's filesystem
    "namespaces",
    "user",      // the payload runs as the sandbox's host uid (or the caller's), not policy.user
    "hostname",  // the host's
};

std::vector<std::string> unenforced_here(bool own_uid, int abi) {
  std::vector<std::string> fields = kAlwaysUnenforced;
  if (!own_uid) fields.push_back("limits.pids");  // RLIMIT_NPROC would count the caller's own
  if (abi < landlock::kAbiScoped) {
    fields.push_back("isolation.abstract_unix_sockets");
    fields.push_back("isolation.signals");
  }
  return fields;
}

const std::vector<std::string> kEnforced = {"limits.wall_time_ms",
                                            "limits.kill_grace_ms",
                                            "limits.output_bytes",
                                            "limits.file_size_bytes",
                                            "limits.open_files",
                                            "filesystem.mounts",
                                            "filesystem.workdir",
                                            "network",
                                            "seccomp",
                                            "capabilities",
                                            "env",
                                            "python"};

bool runtime_is_root() {
  return geteuid() == 0;
}

// The child's verdict: nothing before EOF means it reached the exec of init.
process::ChildReport read_verdict(int fd) {
  return process::read_child_report(fd, kChildVerdictMs);
}

// What a verdict says went wrong; "" when nothing did.
std::string describe(const process::ChildReport& verdict) {
  switch (verdict.kind) {
    case process::ChildReport::Kind::timed_out:
      return "the confined child did not reach the exec of rlm-sandbox-init within 10 s";
    case process::ChildReport::Kind::failed:
      return std::string("confining the sandbox: ") + verdict.failure.step + ": " +
             sys::errno_text(verdict.failure.error);
    case process::ChildReport::Kind::exec:
    case process::ChildReport::Kind::unreadable:
      break;
  }
  return "";
}

// Starts a child that applies `confinement` and then runs `then` (exec); a failing step is
// written to `verdict`, which the parent reads. Every signal stays blocked in the child.
template <typename Then>
pid_t start_confined(const Confinement& confinement, const supervisor::Pipe& verdict, Then then) {
  const int verdict_fd = verdict.write.get();
  const auto child = process::start_child({}, [&confinement, verdict_fd, &then] {
    process::ChildFailure failure;
    if (!confinement.apply_in_child(failure)) process::exit_with_failure(verdict_fd, failure, 127);
    then();
  });
  if (child.pid < 0) throw std::system_error(child.error, std::generic_category(), "fork");
  return child.pid;
}

// A whole confinement applied once in a child, with the policy of an empty sandbox: why it fails
// here, or "". Cached for the process.
std::string probe(const std::string& init_path) {
  static std::mutex mutex;
  static std::optional<std::string> cached;
  std::lock_guard lock(mutex);
  if (cached) return *cached;
  std::string problem;
  try {
    Policy empty;
    empty.filesystem.mounts = {};
    const Confinement confinement = Confinement::prepare(empty, init_path);
    supervisor::Pipe verdict = supervisor::make_pipe();
    const pid_t pid = start_confined(confinement, verdict, [] { _exit(0); });
    verdict.write.reset();
    const auto failure = read_verdict(verdict.read.get());
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (failure.kind == process::ChildReport::Kind::failed)
      problem = describe(failure);
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      problem = "the confinement probe's child ended abnormally";
  } catch (const std::exception& error) {
    problem = error.what();
  }
  cached = problem;
  return problem;
}

void set_variable(std::vector<std::string>& environment, const std::string& name,
                  const std::string& value) {
  const std::string prefix = name + "=";
  const auto it = std::find_if(environment.begin(), environment.end(),
                               [&](const std::string& entry) { return entry.starts_with(prefix); });
  if (it != environment.end())
    *it = prefix + value;
  else {
    environment.push_back(prefix + value);
    std::sort(environment.begin(), environment.end());
  }
}

std::optional<std::string> variable(const std::vector<std::string>& environment,
                                    const std::string& name) {
  const std::string prefix = name + "=";
  for (const auto& entry : environment)
    if (entry.starts_with(prefix)) return entry.substr(prefix.size());
  return std::nullopt;
}

class LandlockBackend final : public Backend {
 public:
  LandlockBackend() : init_(supervisor::locate_init()) {}

  std::string_view name() const override { return "landlock"; }
  bool isolated() const override { return true; }

  std::string unavailable_reason() const override {
    if (init_.path.empty()) return init_.problem() + "; to fix: " + supervisor::InitLocation::fix();
    if (landlock::abi_version() < 1)
      return "Landlock is not available here (landlock_create_ruleset fails); to fix: " +
             std::string(kFix);
    if (auto problem = probe(init_.path); !problem.empty())
      return "the landlock backend cannot confine a process here: " + problem;
    return "";
  }

  Health health() const override {
    Health health;
    health.backend = "landlock";
    health.isolated = true;
    const int abi = landlock::abi_version();
    const bool own_uid = runtime_is_root();
    health.enforced = kEnforced;
    health.network = {"none", "host"};
    if (own_uid) health.enforced.push_back("limits.pids");
    health.unenforced = unenforced_here(own_uid, abi);
    health.fallbacks["limits.memory_bytes"] =
        "RLIMIT_AS per process: each process may map the whole budget; nothing counts them "
        "together";
    health.fallbacks["limits.cpu_time_ms"] =
        "RLIMIT_CPU per process: a chain of short-lived processes is not bounded as a whole";
    if (own_uid)
      health.fallbacks["limits.pids"] = "RLIMIT_NPROC of the sandbox's own host uid (from " +
                                        host::sandbox_uid_range().describe() + ")";
    health.host = {{"landlock_abi", abi}, {"runtime_uid", geteuid()}, {"own_uid", own_uid}};
    const std::string why = unavailable_reason();
    health.available = why.empty();
    if (!health.available) {
      health.detail = why;
      health.fix = init_.path.empty() ? supervisor::InitLocation::fix() : kFix;
      return health;
    }
    health.detail =
        "Landlock ABI " + std::to_string(abi) +
        ": the payload runs on the host's filesystem and process space, confined by Landlock "
        "(read/write/execute beneath the policy's bind sources, a fresh per-run directory for "
        "each tmpfs" +
        std::string(abi >= landlock::kAbiTcp ? ", TCP bind/connect denied under network none"
                                             : ", no inet sockets under network none") +
        (abi >= landlock::kAbiScoped ? ", abstract unix sockets and signals scoped" : "") +
        "), seccomp, rlimits, no_new_privs and no capabilities, as " +
        (own_uid ? "a host uid of its own per sandbox"
                 : "the caller's uid (the runtime is not root)") +
        "; no PID or mount isolation, no private /tmp, no memory total (see unenforced)";
    return health;
  }

  Result run(const Request& request, const Policy& policy) override {
    supervisor::RunStart run("landlock", request, policy);
    run.result.unenforced = unenforced_here(runtime_is_root(), landlock::abi_version());
    if (policy.limits.cpus) run.result.unenforced.push_back("limits.cpus");
    if (auto why = unavailable_reason(); !why.empty()) return run.setup_failed(why);
    if (auto why = supervisor::unenforceable_network(policy, "landlock"); !why.empty())
      return run.setup_failed(why);

    std::optional<Confinement> confinement;
    supervisor::InitProcess process;
    std::optional<supervisor::InitLaunch> launch;
    supervisor::Pipe verdict;
    seccomp::PayloadFilter filter;
    try {
      confinement.emplace(
          Confinement::prepare(policy, init_.path, request.bind_owner.value_or(caller_ids())));
      filter = seccomp::prepare_payload_filter(policy.seccomp);
      filter.kill = supervisor::above_stdio(std::move(filter.kill));
      if (filter.notify) filter.notify = supervisor::above_stdio(std::move(filter.notify));
    } catch (const std::exception& error) {
      return run.setup_failed(error.what());
    }

    // The tmpfs stand-ins replace the targets the policy names for the payload's places.
    if (!confinement->tmp_dir().empty())
      set_variable(run.environment, "TMPDIR", confinement->tmp_dir());
    if (const auto home = variable(run.environment, "HOME"))
      set_variable(run.environment, "HOME", confinement->payload_path(*home));
    else if (!confinement->tmp_dir().empty())
      set_variable(run.environment, "HOME", confinement->tmp_dir());
    std::string workdir = policy.filesystem.workdir.empty()
                              ? confinement->tmp_dir()
                              : confinement->payload_path(policy.filesystem.workdir);

    auto options = supervisor::supervision_options(request, policy, run.deadline());
    const auto context =
        supervisor::run_context(policy, run.argv.front(), workdir, init_.path, run.wall_limit);
    supervisor::InitSettings settings;
    settings.grace = policy.limits.kill_grace;
    settings.rlimits = supervisor::policy_rlimits(policy.limits);
    // Its own uid: RLIMIT_NPROC counts that uid's processes, which are this sandbox's alone.
    if (confinement->own_uid())
      settings.rlimits.push_back(
          {supervisor::Resource::nproc, policy.limits.pids, policy.limits.pids});
    settings.workdir = workdir;
    settings.seccomp_fd = filter.kill.get();
    settings.seccomp_notify_fd = filter.notify ? filter.notify.get() : -1;
    settings.guard_signals = request.guard_signals;
    settings.payload_argv = std::move(run.argv);

    try {
      supervisor::InitStdio stdio;
      if (supervisor::uses_payload_stdio(request))
        stdio = {supervisor::InitStdio::Kind::given, request.payload_stdio};
      launch.emplace(init_.path, supervisor::init_arguments(init_.path, std::move(settings)),
                     std::move(run.environment), stdio);
      launch->inherit(request.inherit_fds);
      launch->keep_for_init(filter.kill.get());
      if (filter.notify) launch->keep_for_init(filter.notify.get());
      verdict = supervisor::make_pipe();
      const supervisor::InitLaunch& ready = *launch;
      const pid_t pid = start_confined(*confinement, verdict, [&ready] { ready.exec_in_child(); });
      verdict.write.reset();
      process = launch->finish(pid);
    } catch (const std::system_error& error) {
      return run.setup_failed(std::string("cannot start rlm-sandbox-init: ") + error.what());
    } catch (const Error& error) {
      return run.setup_failed(error.what());
    }
    const std::string failure = describe(read_verdict(verdict.read.get()));
    if (!failure.empty()) {
      // The child exited before init: supervision reaps it; the Result is the setup's failure.
      supervisor::supervise_init(process, std::move(options));
      return run.setup_failed(failure);
    }
    return run.supervise_to_the_end(request, process, std::move(options), context);
  }

 private:
  const supervisor::InitLocation init_;
};

}  // namespace

std::unique_ptr<Backend> make_landlock_backend() {
  return std::make_unique<LandlockBackend>();
}

}  // namespace rlm::landlock_backend
