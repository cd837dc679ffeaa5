// The namespace backend's sandbox, built and then launched. Phases: prepare (parent, before
// clone: everything that allocates or may fail in a way worth a message), the child's pipeline
// (child.cpp, raw syscalls only), finish in the parent (id maps, cgroup attach, release, init's
// exec in await mode) -- that is build(); then launch(): the request's limits, the payload
// message, supervision, the Result.
#include "namespace/built_sandbox.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "cgroup/cgroup.hpp"
#include "egress/proxy.hpp"
#include "host/owned_files.hpp"
#include "namespace/child.hpp"
#include "namespace/child_setup.hpp"
#include "namespace/limits.hpp"
#include "namespace/rearm.hpp"
#include "namespace/setup_fix.hpp"
#include "namespace/userns.hpp"
#include "process/child_failure.hpp"
#include "process/child_start.hpp"
#include "rlm_init/protocol.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"
#include "seccomp/seccomp.hpp"
#include "supervisor/init.hpp"
#include "supervisor/launch.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/supervise.hpp"

namespace rlm::ns {
namespace {

using Clock = std::chrono::steady_clock;
using host::UniqueFd;

std::uint64_t clone_flags(const Policy& policy) {
  std::uint64_t flags = CLONE_NEWUSER;
  if (policy.namespaces.pid) flags |= CLONE_NEWPID;
  if (policy.namespaces.mount) flags |= CLONE_NEWNS;
  // "none" is what the network namespace gives; "host" shares the host's (policy validation
  // makes namespaces.net agree; a policy built in code that does not is held to `network`).
  if (policy.network != Network::host) flags |= CLONE_NEWNET;
  if (policy.namespaces.ipc) flags |= CLONE_NEWIPC;
  if (policy.namespaces.uts) flags |= CLONE_NEWUTS;
  // The cgroup namespace is made by the child once it is inside the run's group.
  return flags;
}

// Kills and reaps the cloned child unless supervision took it over. SIGKILL to PID 1 of the
// namespace takes everything in it along.
class ChildGuard {
 public:
  explicit ChildGuard(pid_t pid) : pid_(pid) {}
  ~ChildGuard() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  void release() { pid_ = -1; }

 private:
  pid_t pid_;
};

// Everything the child needs, built before clone; it outlives the child's exec.
struct Preparation {
  UniqueFd init_fd;
  seccomp::PayloadFilter filter;
  IdMapping ids;
  std::optional<RootfsPlan> rootfs;
  std::optional<LoopbackPlan> loopback;
  std::optional<netns::EgressCapturePlan> egress_capture;  // an allowlist's routes and listeners
  std::optional<egress::UpstreamSettings> upstream;
  std::shared_ptr<const egress::Credentials> credentials;  // its injections; their CA
  std::unique_ptr<egress::EgressProxy> proxy;  // serves them once the child handed them over
  std::optional<PrivilegePlan> privileges;
  std::optional<LandlockPlan> landlock;
  std::unique_ptr<cgroup::RunCgroup> cgroup;
  std::string cgroup_problem;  // why there is no cgroup
  std::optional<supervisor::InitLaunch> launch;
  supervisor::Pipe release, errors;
  // Init's await socket: its end crosses into the sandbox (closed here once init runs); ours
  // carries the payload message and, by closing, tells init its host is gone.
  UniqueFd await_host, await_init;
  ChildPlan plan;
  // Where root's binds could not be idmapped: whose the sandbox uid's files there become.
  std::optional<HostIds> reclaim_to;
};

// The live counters a caller may read from another thread while run() supervises: the cgroup's,
// and an allowlist's network account (a session's cells take their slices of it); and the
// allowlist's narrowing.
class CgroupProbe {
 public:
  CgroupProbe(const cgroup::RunCgroup* cgroup, egress::EgressProxy* proxy)
      : cgroup_(cgroup), proxy_(proxy) {}
  LiveCounters read() {
    std::lock_guard lock(mutex_);
    LiveCounters counters;
    if (proxy_) counters.network = proxy_->account();
    if (!cgroup_) return counters;
    try {
      counters.oom_kills = cgroup_->oom_kills();
      counters.cpu = cgroup_->cpu_time();
    } catch (const std::exception&) {
    }
    return counters;
  }
  void narrow_network(const Egress& narrower) {
    std::lock_guard lock(mutex_);
    if (proxy_) proxy_->narrow(narrower);
  }
  void detach() {
    std::lock_guard lock(mutex_);
    cgroup_ = nullptr;
    proxy_ = nullptr;
  }

 private:
  std::mutex mutex_;
  const cgroup::RunCgroup* cgroup_;
  egress::EgressProxy* proxy_;  // an allowlist's account and list
};

void collect_stale_groups_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      cgroup::collect_stale_groups();
    } catch (const std::exception&) {
      // Leftovers of a crashed runtime are not this run's problem.
    }
  });
}

// Init's await socket, its command line and stdio, and the pipes to its first process: for the
// first init of a sandbox (prepare) and each next one of a recycled sandbox (recycle).
void prepare_init(Preparation& p, const Policy& policy, const std::string& init_path, bool ahead) {
  int await[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, await) != 0)
    throw Error("cannot make init's await socket: " + sys::errno_text(errno));
  p.await_host = supervisor::above_stdio(UniqueFd(await[0]));
  p.await_init = supervisor::above_stdio(UniqueFd(await[1]));

  supervisor::InitSettings settings;
  settings.grace = policy.limits.kill_grace;
  settings.seccomp_fd = p.filter.kill.get();
  settings.seccomp_notify_fd = p.filter.notify.get();
  settings.pid1 = policy.namespaces.pid;
  settings.await_fd = p.await_init.get();
  // Built ahead (a pool's): init stays after its report until the sandbox is destroyed, so the
  // namespaces' teardown runs when the pool cleans up, not beside the next run. Only with a cgroup:
  // without one, supervision waits for init's exit to count the usage (launch()'s defer_reap).
  settings.hold_after_report = ahead && p.cgroup != nullptr;
  // argv[0] is what the sandbox sees in /proc/1/cmdline; the path is the host's. Init's own
  // environment is empty and its stdio /dev/null: the payload's come with its message.
  auto args = supervisor::init_arguments(init_protocol::kBinaryName, std::move(settings));
  p.launch.emplace(init_path, std::move(args), std::vector<std::string>{},
                   supervisor::InitStdio{supervisor::InitStdio::Kind::null, {}});
  p.launch->inherit({p.await_init.get()});
  p.release = supervisor::make_pipe();
  p.errors = supervisor::make_pipe();
}

// Throws Error or std::system_error with a message for the Result. Nothing of a request: init
// starts in await mode and receives its payload from launch().
void prepare(Preparation& p, const Policy& policy, const std::string& init_path, bool ahead,
             const HostIds& bind_owner) {
  // The host mounts under the binds and the cgroup hierarchies (found twice) read the mount
  // table once between them (self_readings.hpp).
  const sys::SelfReadingScope readings;
  p.init_fd = supervisor::above_stdio(UniqueFd(open(init_path.c_str(), O_RDONLY | O_CLOEXEC)));
  if (!p.init_fd) throw Error("cannot open " + init_path + ": " + sys::errno_text(errno));
  p.filter = seccomp::prepare_payload_filter(policy.seccomp);
  p.filter.kill = supervisor::above_stdio(std::move(p.filter.kill));
  p.filter.notify = supervisor::above_stdio(std::move(p.filter.notify));
  p.ids = prepare_id_mapping(policy.user);
  if (policy.network == Network::allowlist && !policy.egress.inject.empty()) {
    if (!policy.namespaces.mount)
      throw Error(
          "network.inject: the sandbox's trust store for the hosts whose credentials are injected "
          "is written into its root, which needs namespaces.mount; to fix: set it true");
    p.upstream = egress::UpstreamSettings::from_environment();
    p.credentials = std::make_shared<const egress::Credentials>(policy.egress, *p.upstream);
  }
  if (policy.namespaces.mount)
    p.rootfs = RootfsPlan::prepare(
        policy, p.credentials
                    ? std::vector<RootfsPlan::GeneratedFile>{{kInjectionTrustBundle,
                                                              p.credentials->trust_bundle(),
                                                              "network.inject"}}
                    : std::vector<RootfsPlan::GeneratedFile>{});
  // A root runtime's sandbox uid must own nothing that outlives it (idmap.hpp): its read-write
  // binds are idmapped to their owner, root included (whose directories are then marked,
  // written_mark.hpp). Where this host cannot idmap, root's sandbox writes as its own uid (where
  // the bind's modes let anyone) and what it wrote is given to the output uid when it ends, never
  // to root (sandbox_write_owner).
  if (p.rootfs && p.ids.privileged && p.rootfs->has_writable_binds() &&
      !p.rootfs->idmap_writable_binds(bind_owner, p.ids.host_uid, p.ids.host_gid))
    p.reclaim_to = host::sandbox_write_owner(bind_owner);
  if (policy.network != Network::host) p.loopback = LoopbackPlan::prepare();
  if (policy.network == Network::allowlist) {
    if (auto why = netns::capability_problem(policy, policy.namespaces.user); !why.empty())
      throw Error(why);
    p.egress_capture = netns::EgressCapturePlan::prepare(policy.egress);
    if (!p.upstream) p.upstream = egress::UpstreamSettings::from_environment();
  }
  p.privileges = PrivilegePlan::prepare(policy);
  // Defence in depth: the mounts' rules, where the kernel has Landlock. Without a mount namespace
  // the sandbox sees the host's tree by design, and nothing is added.
  if (p.rootfs) p.landlock = LandlockPlan::prepare(policy, *p.rootfs, init_path);

  collect_stale_groups_once();
  auto created = cgroup::RunCgroup::create(policy.limits);
  p.cgroup = std::move(created.group);
  p.cgroup_problem = std::move(created.problem);

  prepare_init(p, policy, init_path, ahead);

  ChildPlan& plan = p.plan;
  if (p.cgroup) {
    const auto join = p.cgroup->self_join_fds();
    if (join.size() > plan.join_cgroup_fds.size())
      throw Error("more cgroup hierarchies than a sandbox joins: " + p.cgroup->describe());
    std::copy(join.begin(), join.end(), plan.join_cgroup_fds.begin());
  }
  plan.release_read = p.release.read.get();
  plan.release_write = p.release.write.get();
  plan.error_read = p.errors.read.get();
  plan.error_write = p.errors.write.get();
  plan.ids = &p.ids;
  plan.cgroup_namespace = policy.namespaces.cgroup;
  plan.rootfs = p.rootfs ? &*p.rootfs : nullptr;
  if (policy.namespaces.uts) {
    plan.hostname = policy.hostname.c_str();
    plan.hostname_length = policy.hostname.size();
  }
  plan.loopback = p.loopback ? &*p.loopback : nullptr;
  plan.egress = p.egress_capture ? &*p.egress_capture : nullptr;
  plan.exec.launch = &*p.launch;
  plan.exec.pass_fds = {p.filter.kill.get(), p.filter.notify.get()};
  plan.exec.privileges = &*p.privileges;
  plan.exec.landlock = p.landlock ? &*p.landlock : nullptr;
  plan.exec.init_fd = p.init_fd.get();
  plan.exec.max_fd = p.launch->max_fd();
}

std::optional<std::string> read_setup_failure(int error_read);

// The allowlist's host side, on the listeners the child made in the sandbox's network namespace.
// Before the child's exec (the cold path) it may still be on its way there: a child that failed
// first said why on its error pipe, which that failure names.
void start_egress_proxy(Preparation& p, const Policy& policy, Clock::time_point deadline) {
  try {
    p.proxy = std::make_unique<egress::EgressProxy>(p.egress_capture->receive(deadline),
                                                    policy.egress, *p.upstream, p.credentials);
  } catch (const Error& error) {
    if (auto failure = read_setup_failure(p.errors.read.get())) throw Error(*failure);
    throw;
  }
}

// Clone, finish the setup from outside while the child waits, release it, and (`wait_exec`) wait
// for its exec of init. Throws Error saying what failed; the child is then killed and reaped,
// before the caller's Preparation removes the cgroup. Without `wait_exec` the child is still
// building the sandbox on return: p.errors.read then says later whether it failed (read_setup_
// failure), and p.release.write stays open until the sandbox is destroyed (the child's check that
// its parent is alive after PR_SET_PDEATHSIG reads it).
supervisor::InitProcess start_sandbox(Preparation& p, const Policy& policy,
                                      Clock::time_point deadline, bool wait_exec) {
  // Signals stay blocked in the child until init has its signalfd: an early SIGTERM stays pending
  // for init. The user namespace is owned by the sandbox's host uid, not root (userns.hpp): the
  // owner switch lives across the clone, made once the signals are blocked.
  const process::ChildOptions options{clone_flags(policy),
                                      p.cgroup ? p.cgroup->clone_into_fd() : -1};
  const ChildPlan& plan = p.plan;
  const auto child = process::start_child(
      options, [&plan] { run_child(plan); }, [&p] { return OwnerSwitch(p.ids); });
  // Here the thread's own ids and signal mask are back.
  if (child.pid < 0) throw SetupError("clone of the sandbox's namespaces", child.error);
  host::UniqueFd pidfd(child.pidfd);
  ChildGuard guard(child.pid);
  p.release.read.reset();
  p.errors.write.reset();
  // The child has its own copy of init's end: from here a child that dies before init takes its
  // payload turns a send on our end into EPIPE rather than a wait.
  p.await_init.reset();
  p.plan.exec.landlock = nullptr;
  p.landlock.reset();  // the child has its own copy of the ruleset
  if (p.egress_capture) p.egress_capture->close_child_end();

  write_id_maps(child.pid, p.ids);
  // The child joins v1 groups itself (ChildPlan::join_cgroup_fds); v2 without clone3 needs us.
  if (p.cgroup && !child.into_cgroup && p.plan.join_cgroup_fds[0] < 0) {
    try {
      p.cgroup->attach(child.pid);
    } catch (const std::exception& error) {
      throw Error(std::string("cannot move the sandbox into its cgroup: ") + error.what());
    }
  }
  const char go = 1;
  if (write(p.release.write.get(), &go, 1) != 1)
    throw Error("cannot release the sandbox's first process: " + sys::errno_text(errno));
  if (wait_exec) {
    wait_for_exec(p.errors.read.get(), sys::poll_timeout_ms(deadline));
    p.release.write.reset();  // the child no longer needs to see us alive
  }
  if (p.egress_capture) start_egress_proxy(p, policy, deadline);
  // Our copies of the child's stdio and report ends go; the child holds its own since the clone.
  auto process = p.launch->finish(child.pid, std::move(pidfd));
  guard.release();
  return process;
}

// After a start without waiting for the exec, once the child is gone: the step at which it failed
// before init's exec, or nothing when it reached the exec (the pipe closed on it) or was killed.
std::optional<std::string> read_setup_failure(int error_read) {
  // Never waits on the sandbox.
  const auto report = process::read_child_report(error_read, 0);
  switch (report.kind) {
    case process::ChildReport::Kind::exec:
    case process::ChildReport::Kind::timed_out:
      return std::nullopt;
    case process::ChildReport::Kind::unreadable:
      return std::string("sandbox setup failed: reading the setup result: ") +
             sys::errno_text(report.failure.error);
    case process::ChildReport::Kind::failed:
      break;
  }
  return SetupError(report.failure.step, report.failure.error).what();
}

bool same_cgroup_limits(const Limits& a, const Limits& b) {
  return a.memory_bytes == b.memory_bytes && a.pids == b.pids && a.cpus == b.cpus;
}

}  // namespace

struct BuiltSandbox::State {
  Preparation p;  // first: destroyed last, after init is gone
  supervisor::InitProcess process;
  Limits built;  // the limits the cgroup and the root filesystem were made with
  std::string init_path;
  bool launched = false;
  bool exec_pending = false;        // started without waiting for init's exec (run_cold)
  HostIds bind_owner;               // whose the files written through its read-write binds are
  bool has_writable_binds = false;  // built for `bind_owner` (idmapped to it)

  // Recycling (recycle()): the policy its next init is made for, why it cannot be recycled ("":
  // it can), the limits last written to the cgroup, and, from the first recycle on, the first
  // init's user, mount and network namespaces and the plans that make a copy of the tree fresh.
  Policy policy;
  std::string recycle_problem;
  Limits applied;
  UniqueFd user_ns, mount_ns, net_ns;
  std::optional<RootfsPlan> refresh, refresh_workdir;
};

BuiltSandbox::BuiltSandbox() : state_(std::make_unique<State>()) {}

BuiltSandbox::~BuiltSandbox() {
  auto& process = state_->process;
  if (process.pid > 0) {
    // SIGKILL to PID 1 of the namespace takes everything in it along (and, without a PID
    // namespace, the cgroup's kill below does). Our unreaped child: the pid is still ours.
    kill(process.pid, SIGKILL);
    while (waitpid(process.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    process.pid = -1;
  }
  Preparation& p = state_->p;
  if (p.reclaim_to) {
    p.cgroup.reset();  // killed and removed: nothing of the sandbox writes any more
    for (const auto& source : p.rootfs->writable_bind_sources())
      if (!host::give_to_owner(source, p.ids.host_uid, p.ids.host_gid, *p.reclaim_to))
        p.ids.slot.quarantine();
  }
  // The Preparation goes next: the cgroup is killed and removed, then the uid is freed.
}

std::unique_ptr<BuiltSandbox> BuiltSandbox::build(const Policy& policy,
                                                  const std::string& init_path,
                                                  Clock::time_point deadline) {
  return start(policy, init_path, deadline, true, caller_ids());
}

Result BuiltSandbox::run_cold(const Request& request, const Policy& policy,
                              const std::string& init_path, supervisor::RunStart& run) {
  std::unique_ptr<BuiltSandbox> sandbox;
  try {
    sandbox =
        start(policy, init_path, run.deadline(), false, request.bind_owner.value_or(caller_ids()));
  } catch (const Error& error) {
    return run.setup_failed(error.what());
  }
  return sandbox->launch(request, policy, run);
}

std::unique_ptr<BuiltSandbox> BuiltSandbox::start(const Policy& policy,
                                                  const std::string& init_path,
                                                  Clock::time_point deadline, bool wait_exec,
                                                  const HostIds& bind_owner) {
  if (!policy.namespaces.user)
    throw Error(
        "namespaces.user: false is not supported by the namespace backend: its isolation "
        "(an unmapped root, capabilities confined to the sandbox) rests on a user namespace");
  std::unique_ptr<BuiltSandbox> sandbox(new BuiltSandbox());
  State& s = *sandbox->state_;
  s.built = policy.limits;
  s.init_path = init_path;
  try {
    prepare(s.p, policy, init_path, wait_exec, bind_owner);
  } catch (const std::exception& error) {
    throw Error(std::string("cannot prepare the sandbox: ") + error.what());
  }
  s.bind_owner = bind_owner;
  s.has_writable_binds = s.p.rootfs && s.p.ids.privileged && s.p.rootfs->has_writable_binds();
  s.process = start_sandbox(s.p, policy, deadline, wait_exec);
  s.exec_pending = !wait_exec;
  s.applied = policy.limits;
  if (wait_exec) {  // built ahead: a pool may ask to recycle it
    s.recycle_problem = recycle_problem(policy, s.p.ids.privileged, s.p.cgroup != nullptr,
                                        s.p.reclaim_to.has_value());
    if (s.recycle_problem.empty()) s.policy = policy;
  }
  return sandbox;
}

bool BuiltSandbox::can_serve(const Limits& limits, const HostIds& bind_owner) const {
  const State& s = *state_;
  if (s.has_writable_binds && s.bind_owner != bind_owner) return false;
  if (limits.tmpfs_bytes != s.built.tmpfs_bytes) return false;  // mounted with the built size
  if (limits.cpus == s.built.cpus) return true;
  return !limits.cpus || (s.p.cgroup && s.p.cgroup->cpu_bandwidth_limited());
}

bool BuiltSandbox::waiting() const {
  const State& s = *state_;
  if (s.launched || s.process.pid <= 0) return false;
  // The pidfd turns readable once init has exited; the report pipe's EOF says the same without one.
  pollfd gone[2] = {{s.process.pidfd.get(), POLLIN, 0}, {s.process.report_pipe.get(), POLLIN, 0}};
  return poll(gone, 2, 0) == 0;
}

bool BuiltSandbox::recycle() {
  State& s = *state_;
  Preparation& p = s.p;
  if (!s.launched || !s.recycle_problem.empty() || s.process.pid <= 0) return false;
  try {
    // The last init is held after its report, every other process of its run dead and reaped:
    // what it leaves is its namespaces. The first one's user, mount and network namespaces are
    // the ones every later run enters.
    const std::string ns = "/proc/" + std::to_string(s.process.pid) + "/ns/";
    const auto open_ns = [&ns](const char* name) {
      UniqueFd fd(open((ns + name).c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd) throw Error("cannot open " + ns + name + ": " + sys::errno_text(errno));
      return fd;
    };
    if (!s.mount_ns) {
      s.user_ns = open_ns("user");
      s.mount_ns = open_ns("mnt");
      s.net_ns = open_ns("net");
      s.refresh = RootfsPlan::prepare_refresh(s.policy, p.ids.host_uid, p.ids.host_gid);
      s.refresh_workdir = RootfsPlan::prepare_refresh_workdir(s.policy);
    }
    if (!network_namespace_is_empty(s.process.pid)) return false;

    // Its PID namespace ends with it: once it is reaped, nothing of the run is left running.
    kill(s.process.pid, SIGKILL);
    while (waitpid(s.process.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    s.process = supervisor::InitProcess{};
    if (!p.cgroup->empty()) return false;

    prepare_init(p, s.policy, s.init_path, true);
    std::optional<LandlockPlan> landlock;
    if (p.rootfs) landlock = LandlockPlan::prepare(s.policy, *p.rootfs, s.init_path);
    RearmPlan plan;
    plan.user_ns = s.user_ns.get();
    plan.mount_ns = s.mount_ns.get();
    plan.net_ns = s.net_ns.get();
    plan.alive_read = p.release.read.get();
    plan.alive_write = p.release.write.get();
    plan.error_read = p.errors.read.get();
    plan.error_write = p.errors.write.get();
    plan.join_cgroup_fds = p.plan.join_cgroup_fds;  // v1's, opened at the build
    plan.refresh = &*s.refresh;
    plan.workdir = &*s.refresh_workdir;
    plan.hostname = s.policy.hostname.c_str();
    plan.hostname_length = s.policy.hostname.size();
    plan.ids = &p.ids;
    plan.cgroup_namespace = s.policy.namespaces.cgroup;
    plan.exec.launch = &*p.launch;
    plan.exec.pass_fds = {p.filter.kill.get(), p.filter.notify.get()};
    plan.exec.privileges = &*p.privileges;
    plan.exec.landlock = landlock ? &*landlock : nullptr;
    plan.exec.init_fd = p.init_fd.get();
    plan.exec.max_fd = p.launch->max_fd();

    // v1: the child joins the groups through their tasks files (a thread's own move, cheap), so it
    // can share this process's memory until its exec rather than copy it. v2: clone3 starts it in
    // the group (a move by cgroup.procs would take the kernel's threadgroup lock), as a fork.
    constexpr std::uint64_t kRunNamespaces = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
    const auto run_child = [&plan] { run_rearmed_child(plan); };
    const bool joins_itself = plan.join_cgroup_fds[0] >= 0;
    const auto child = joins_itself
                           ? process::start_vfork_child(kRunNamespaces, run_child)
                           : process::start_child({kRunNamespaces, p.cgroup->clone_into_fd()},
                                                  run_child, [] { return 0; });
    if (child.pid < 0) return false;
    UniqueFd pidfd(child.pidfd);
    ChildGuard guard(child.pid);
    if (!joins_itself && !child.into_cgroup) return false;  // v2 without clone3
    p.release.read.reset();
    p.errors.write.reset();
    p.await_init.reset();
    landlock.reset();
    constexpr int kExecTimeoutMs = 10'000;
    wait_for_exec(p.errors.read.get(), kExecTimeoutMs);
    p.release.write.reset();
    s.process = p.launch->finish(child.pid, std::move(pidfd));
    guard.release();
    // The counters start here: after the template let go of the first run's files, and without
    // what making the new init cost.
    if (!p.cgroup->begin_next_run()) return false;
    s.launched = false;
    return true;
  } catch (const std::exception&) {
    return false;  // not shown fresh: destroyed by the caller
  }
}

Result BuiltSandbox::run(const Request& request, const Policy& policy) {
  supervisor::RunStart run("namespace", request, policy);
  return launch(request, policy, run);
}

Result BuiltSandbox::launch(const Request& request, const Policy& policy,
                            supervisor::RunStart& run) {
  State& s = *state_;
  Preparation& p = s.p;
  if (s.launched) throw Error("a warm sandbox runs one payload only");
  s.launched = true;
  const auto context = supervisor::run_context(policy, run.argv.front(), policy.filesystem.workdir,
                                               s.init_path, run.wall_limit);
  const bool caller_stdio = supervisor::uses_payload_stdio(request);

  // The request's limits, written before the payload exists.
  if (p.cgroup && !same_cgroup_limits(policy.limits, s.applied)) {
    // A recycled sandbox's last run may have tightened them: back to the built CPU bandwidth
    // where this request names none.
    Limits wanted = policy.limits;
    if (!wanted.cpus) wanted.cpus = s.built.cpus;
    try {
      p.cgroup->tighten(wanted);
      s.applied = wanted;
    } catch (const Error& error) {
      return run.setup_failed(std::string("cannot apply the request's limits: ") + error.what());
    }
  }
  supervisor::PayloadMessage message;
  message.argv = std::move(run.argv);
  message.environment = std::move(run.environment);
  message.workdir = policy.filesystem.workdir;
  message.rlimits = init_rlimits(policy.limits, p.cgroup != nullptr);
  message.guard_signals = request.guard_signals;
  message.grace = policy.limits.kill_grace;
  message.inherit_fds = request.inherit_fds;
  supervisor::StdioPipes pipes;
  try {
    supervisor::check_inherit_fds(request.inherit_fds);
    if (caller_stdio) {
      message.stdio = request.payload_stdio;
    } else {
      pipes = supervisor::make_stdio_pipes();
      for (std::size_t i = 0; i < 3; ++i) message.stdio[i] = pipes.child[i].get();
    }
  } catch (const std::system_error& error) {
    return run.setup_failed(std::string("cannot make the payload's pipes: ") + error.what());
  }
  auto options = supervisor::supervision_options(request, policy, run.deadline());
  // The CPU time of the sandbox, counted over every process it ever had (RLIMIT_CPU, which init
  // still sets, counts each process alone: a chain of short-lived ones escapes it).
  const auto cpu_budget = request.sandbox_cpu_time.value_or(policy.limits.cpu_time);
  auto stopped_at = std::make_shared<CgroupLimit>(CgroupLimit::none);
  if (p.cgroup) {
    // A run that has hit its process limit is stopped there rather than left to spin (a fork
    // bomb retries forever) until the wall limit; one that has used its CPU time at once.
    options.limit_reached = [cgroup = p.cgroup.get(), cpu_budget, stopped_at,
                             stop_at_process_limit = request.stop_at_process_limit] {
      try {
        if (const auto cpu = cgroup->cpu_time(); cpu && *cpu >= cpu_budget) {
          *stopped_at = CgroupLimit::cpu_time;
          return true;
        }
        if (stop_at_process_limit && cgroup->usage().pids_limit_hit) {
          *stopped_at = CgroupLimit::pids;
          return true;
        }
      } catch (const std::exception&) {
      }
      return false;
    };
  }

  // The release: the wall time is the payload's from here.
  run.start = supervisor::RunStart::Clock::now();
  if (p.proxy) p.proxy->restart_clock();
  options.deadline = run.deadline();
  try {
    supervisor::send_payload_message(p.await_host.get(), message, run.deadline());
  } catch (const Error& error) {
    // A child that failed before init's exec closed init's end of the socket when it exited, so
    // the hand-over broke (EPIPE) -- after its own reason reached the error pipe.
    if (s.exec_pending)
      if (auto failure = read_setup_failure(p.errors.read.get())) {
        if (p.cgroup) p.cgroup->kill_all();
        return run.setup_failed(*failure);
      }
    return run.setup_failed(error.what());
  }
  pipes.child = {};  // the payload has its own copies now
  if (!caller_stdio) supervisor::attach_stdio(s.process, std::move(pipes.host));

  // The probe outlives neither the cgroup nor this call: it reads through a guarded pointer.
  auto probe_target = std::make_shared<CgroupProbe>(p.cgroup.get(), p.proxy.get());
  // However this returns (a throw included), a caller's closures let go of the cgroup and the
  // proxy before they go.
  struct DetachProbe {
    std::shared_ptr<CgroupProbe> probe;
    ~DetachProbe() { probe->detach(); }
  } detach_probe{probe_target};
  if (request.on_started) {
    RunningSandbox running;
    running.counters = [probe_target] { return probe_target->read(); };
    if (p.proxy)
      running.narrow_network = [probe_target](const Egress& narrower) {
        probe_target->narrow_network(narrower);
      };
    request.on_started(std::move(running));
  }
  // With a cgroup to count the usage, the Result need not wait for init's exit (the namespaces'
  // teardown, milliseconds): init reports only once every other process is dead and reaped, and
  // this sandbox's destructor reaps init and removes the cgroup.
  options.defer_reap = p.cgroup != nullptr;
  auto supervision = supervisor::supervise_init(s.process, std::move(options));
  const bool init_exiting = s.process.pid > 0;
  probe_target->detach();
  if (s.exec_pending) {
    // A child that failed before its exec said why on the error pipe (it is reaped then: with no
    // report, supervision waited for its exit); after the exec the pipe reads EOF.
    if (auto failure = read_setup_failure(p.errors.read.get())) {
      if (p.cgroup) p.cgroup->kill_all();
      return run.setup_failed(*failure);
    }
  }
  if (supervision.stop != supervisor::StopReason::limit_reached) *stopped_at = CgroupLimit::none;

  cgroup::CgroupUsage usage;
  std::string bandwidth_problem;
  if (p.cgroup) {
    // After the kill, what the last processes used counts too. When init is still exiting its
    // report says every other process is gone, and the kill (which waits for the group to empty)
    // is left to the destructor.
    if (!init_exiting) p.cgroup->kill_all();
    usage = p.cgroup->usage();
    if (policy.limits.cpus && !p.cgroup->cpu_bandwidth_limited())
      bandwidth_problem = p.cgroup->cpu_bandwidth_problem();
  }
  auto end = supervisor::init_run_end(std::move(supervision), context);
  add_cgroup_account(end, usage, cpu_budget, *stopped_at);
  run.fill_from(std::move(end));
  if (p.proxy) {
    // Everything in the sandbox is gone: its connections end with the relays.
    p.proxy->stop();
    run.result.network = p.proxy->account();
  }
  if (!p.cgroup_problem.empty()) note_limit_fallbacks(run.result, p.cgroup_problem, policy.limits);
  if (p.reclaim_to)
    supervisor::add_note(
        run.result,
        "note: this host cannot idmap the read-write binds (no CAP_SYS_ADMIN over their "
        "filesystem, or a filesystem without idmapped mounts), so the sandbox wrote there as its "
        "own uid, where the modes let anyone, and what it wrote now belongs to uid " +
            std::to_string(p.reclaim_to->uid) +
            ", not root; to have root's files written where root may, bind a directory on ext4, "
            "xfs, btrfs or tmpfs from a host (or a container with CAP_SYS_ADMIN)");
  if (p.cgroup_problem.empty() && !usage.cpu) note_cpu_time_per_process(run.result);
  if (!bandwidth_problem.empty()) note_cpu_bandwidth_missing(run.result, bandwidth_problem);
  return run.finish();
}

}  // namespace rlm::ns
