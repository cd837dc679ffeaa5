// The docker backend's one-shot run. Phases: prepare (policy checks, daemon info, the create
// body: everything that may fail with a message, before any container exists), create and attach
// before start (so no output is missed and stdin is connected), stream until the payload's output
// closes or a limit or the deadline hits, stop the container as a whole when needed, read its
// state and record how the run ended (supervisor/outcome.hpp classifies it), remove it -- whatever
// happened.
#include "docker/docker_backend.hpp"

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "cgroup/usage.hpp"
#include "docker/attached_stream.hpp"
#include "docker/container_control.hpp"
#include "docker/container_spec.hpp"
#include "docker/egress_holder.hpp"
#include "docker/health.hpp"
#include "docker/hijack.hpp"
#include "docker/ownership.hpp"
#include "docker/stats_sampler.hpp"
#include "http/http_client.hpp"
#include "rlm_sandbox/error.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/run_start.hpp"

namespace rlm::docker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kExitSlack{250};

std::chrono::milliseconds until(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
}

// Starts the container. Without Docker's init the runtime itself execs the payload, and a
// command it cannot find fails the start: returns Docker's message then (nullopt when it started).
std::optional<std::string> start_or_not_found(const EngineApi& api, const std::string& container) {
  try {
    start_container(api, container);
    return std::nullopt;
  } catch (const DaemonError& error) {
    const std::string message = error.what();
    if (error.status() == 400 && (message.find("executable file not found") != std::string::npos ||
                                  message.find("no such file or directory") != std::string::npos))
      return message;
    throw;
  }
}

// How long a running container's cgroup may stay unreadable before this process concludes it
// cannot see the daemon's containers (another PID namespace, a remote host).
constexpr std::chrono::seconds kCgroupVisibilityWait{2};

// The usage reader of the container's cgroup, found through its PID 1 `pid`. Reading
// /proc/<pid>/cgroup races a payload that exits at once, so a failed read sets `unwatched` only
// while Docker still reports the same process running, for kCgroupVisibilityWait: a container
// that ended meanwhile has no cgroup left, and nothing left to bound. A daemon found unwatchable
// once is not waited for again.
std::optional<cgroup::UsageReader> container_cgroup(const EngineApi& api,
                                                    const std::string& container, int pid,
                                                    bool& unwatched) {
  static std::mutex mutex;
  static std::set<std::string> unwatchable;  // the daemons' socket paths
  unwatched = false;
  if (pid <= 0) return std::nullopt;
  bool known_unwatchable;
  {
    std::lock_guard lock(mutex);
    known_unwatchable = unwatchable.contains(api.socket_path());
  }
  const auto give_up =
      Clock::now() + (known_unwatchable ? Clock::duration{} : kCgroupVisibilityWait);
  for (;;) {
    if (auto reader = cgroup::UsageReader::of_process(pid, container)) return reader;
    const auto state = inspect_state(api, container);
    if (!state.running || state.pid != pid) return std::nullopt;
    if (Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  unwatched = true;
  std::lock_guard lock(mutex);
  unwatchable.insert(api.socket_path());
  return std::nullopt;
}

// The Result the other backends give for a command that is not there: exit 127.
void fill_not_found(Result& result, const std::string& message) {
  supervisor::RunEnd end;
  end.ending = supervisor::Ending::cannot_execute;
  end.exit_code = 127;
  end.problem = message;
  supervisor::classify(std::move(end), result);
}

// How the container ended, as the daemon reported it.
struct Termination {
  std::optional<int> exit_code;  // as Docker reports it; nullopt when it could not say
  bool oom_killed = false;       // the kernel's OOM killer struck in the container
  // The container's CPU time budget (StreamEnd::cpu_limit says it was spent); 0: the policy's.
  std::chrono::milliseconds cpu_budget{0};
};

supervisor::Stop stop_of(StreamEnd end) {
  switch (end) {
    case StreamEnd::deadline:
      return supervisor::Stop::timeout;
    case StreamEnd::output_limit:
      return supervisor::Stop::output_limit;
    case StreamEnd::cpu_limit:
      return supervisor::Stop::cpu_time;
    case StreamEnd::cancelled:
      return supervisor::Stop::cancelled;
    case StreamEnd::caller_error:
      return supervisor::Stop::caller_error;
    case StreamEnd::closed:
      break;
  }
  return supervisor::Stop::none;
}

// How the payload ended, from what the stream and the daemon said.
void fill_ending(supervisor::RunEnd& end, const StreamOutcome& stream,
                 const Termination& termination) {
  using supervisor::Ending;
  if (termination.exit_code) {
    const int code = *termination.exit_code;
    if (code > 128 && code <= 128 + 64)
      end.signal = code - 128;
    else
      end.exit_code = code;
  }
  if (!stream.protocol_error.empty()) {
    end.ending = Ending::setup_failed;
    end.problem = stream.protocol_error;
  } else if (!termination.exit_code) {
    end.ending = Ending::setup_failed;
    end.problem = "the Docker daemon did not report how the payload ended";
  } else if (end.signal != 0) {
    end.ending = Ending::signaled;
  } else if ((end.exit_code == 127 || end.exit_code == 126) &&
             end.stderr_data.find("[FATAL tini") != std::string::npos) {
    // Docker's init (tini) reports a command it cannot execute on stderr and exits 127 or 126.
    end.ending = Ending::cannot_execute;
    end.problem = end.stderr_data.substr(0, end.stderr_data.find('\n'));
  } else {
    end.ending = Ending::exited;
  }
}

// What the stream, the daemon and the container's cgroup said about how the run ended, as the
// RunEnd every backend fills (supervisor/outcome.hpp classifies it). Docker reports a payload
// killed by signal N as exit status 128+N (its init does the same for its child), so 128+N for N
// in 1..64 is read as that signal: a payload that itself exits with 130 is indistinguishable from
// one killed by SIGINT. Docker learns of an OOM kill from an asynchronous event, so the container's
// OOM kill explains only a death by SIGKILL (GroupAccount::kills_only).
supervisor::RunEnd run_end(StreamOutcome stream, const Termination& termination,
                           const CgroupReading& usage, const Policy& policy,
                           std::chrono::milliseconds wall_limit) {
  supervisor::RunEnd end;
  supervisor::set_limits(end, policy.limits, wall_limit);
  if (termination.cpu_budget.count() > 0) end.cpu_budget = termination.cpu_budget;
  end.stop = stop_of(stream.end);
  end.stdout_data = std::move(stream.stdout_data);
  end.stderr_data = std::move(stream.stderr_data);
  end.stdout_truncated = stream.stdout_truncated;
  end.stderr_truncated = stream.stderr_truncated;
  fill_ending(end, stream, termination);

  end.account = supervisor::GroupAccount::kills_only;
  end.oom_killed = termination.oom_killed;
  if (usage.cpu_nanoseconds)
    end.group_cpu = std::chrono::microseconds(*usage.cpu_nanoseconds / 1000);
  end.group_peak_memory = usage.peak_memory_bytes;
  // RLIMIT_CPU counts per process, which Docker does not report: the container's total stands in.
  end.payload_cpu = end.group_cpu.value_or(std::chrono::microseconds(0));

  end.group_noun = "container";
  end.seccomp_rules = "the seccomp profile";
  end.exit_status_reporter = "Docker";
  return end;
}

// The host side of an allowlist as the caller may reach it while the run goes on (its counters,
// a session's narrowing): null once the run is over.
struct LiveEgress {
  std::mutex mutex;
  egress::EgressProxy* proxy = nullptr;
};

class DockerBackend final : public Backend {
 public:
  std::string_view name() const override { return "docker"; }
  bool isolated() const override { return true; }
  Health health() const override { return docker_health(); }
  std::string unavailable_reason() const override { return docker_unavailable_reason(); }
  // A container cannot inherit an fd: sessions reach the worker through a bind-mounted socket.
  bool can_inherit_fds() const override { return false; }

  Result run(const Request& request, const Policy& policy) override {
    require_runnable(request);
    // An invalid request throws here, before anything starts.
    supervisor::RunStart run("docker", request, policy);
    const auto deadline = run.deadline();

    const auto endpoint = endpoint_from_environment();
    if (!endpoint.problem.empty()) return run.setup_failed(endpoint.problem);
    const EngineApi api(endpoint.socket_path);
    DaemonInfo info;
    try {
      info = daemon_info(api);
    } catch (const DaemonError& error) {
      return run.setup_failed(error.what());
    }
    require_supported(policy, info.traits);  // what Docker cannot honour is an Error, not a Result
    collect_stale_containers_once(api);

    const std::string id = new_owned_id();
    // An allowlist: the payload joins the network namespace of a holder container that is set up
    // from here first (egress_holder.hpp). Declared before the payload's remover: removed after.
    std::optional<EgressHolder> holder;
    if (policy.network == Network::allowlist) {
      try {
        holder.emplace(api, policy, info.traits.remaps_users, id, deadline);
      } catch (const DaemonError& error) {
        return run.setup_failed(error.what());
      } catch (const Error& error) {
        return run.setup_failed(error.what());
      }
    }
    ContainerPlan plan;
    plan.command = run.argv;
    plan.environment = std::move(run.environment);
    plan.open_stdin = wants_stdin(request);
    plan.session = id;
    plan.owner = id;
    auto body = create_body(policy, plan);
    if (holder) {
      body["HostConfig"]["NetworkMode"] = holder->network_mode();
      body.erase("Hostname");  // the holder's (Docker refuses one with a container's network)
      if (auto trust = holder->trust_mount(); !trust.is_null())
        body["HostConfig"]["Mounts"].push_back(std::move(trust));
    }
    auto live_egress = std::make_shared<LiveEgress>();
    if (holder) live_egress->proxy = &holder->proxy();
    // However run() returns, a caller's closures let go of the proxy before the holder ends it.
    struct DetachEgress {
      std::shared_ptr<LiveEgress> live;
      ~DetachEgress() {
        std::lock_guard lock(live->mutex);
        live->proxy = nullptr;
      }
    } detach_egress{live_egress};

    ContainerRemover remover(api);
    StreamOutcome stream;
    Termination termination;
    CgroupReading usage;
    bool cpu_unwatched = false;
    try {
      const auto container = create_container(api, body, "rlm-sandbox-" + id);
      remover.hold(container);
      auto connection = open_hijacked(
          api.socket_path(), "POST",
          "/containers/" + container +
              "/attach?stream=1&stdout=1&stderr=1&stdin=" + (plan.open_stdin ? "1" : "0"),
          std::nullopt, std::chrono::seconds(30));
      if (holder) holder->proxy().restart_clock();  // the account's times count from the start
      if (auto not_found = start_or_not_found(api, container)) {
        fill_not_found(run.result, *not_found);
        return run.finish();  // the remover takes the container
      }
      // A payload that is already gone has no cgroup left to read: its usage is not available.
      // A daemon whose containers this process cannot see (another PID namespace, a remote
      // host): only Ulimits' RLIMIT_CPU, per process, holds the CPU time.
      const auto running = inspect_state(api, container);
      auto cgroup = container_cgroup(api, container, running.pid, cpu_unwatched);
      // A session asks before and after each cell how many OOM kills its container has seen, to
      // tell a cell the OOM killer took (memory_limit) from one that crashed. The files are read
      // by path: once the container is gone they simply answer nothing.
      if (request.on_started) {
        RunningSandbox running;
        running.counters = [cgroup, live_egress] {
          auto counters = cgroup ? cgroup->live() : LiveCounters{};
          std::lock_guard lock(live_egress->mutex);
          if (live_egress->proxy) counters.network = live_egress->proxy->account();
          return counters;
        };
        if (holder)
          running.narrow_network = [live_egress](const Egress& narrower) {
            std::lock_guard lock(live_egress->mutex);
            if (live_egress->proxy) live_egress->proxy->narrow(narrower);
          };
        request.on_started(std::move(running));
      }
      // The container's CPU time, every process together, against limits.cpu_time_ms (RLIMIT_CPU,
      // set through Ulimits, counts each process alone).
      termination.cpu_budget = request.sandbox_cpu_time.value_or(policy.limits.cpu_time);
      StatsSampler sampler(std::move(cgroup), termination.cpu_budget);
      auto settings = stream_settings(request, policy, deadline);
      settings.limit_fd = sampler.limit_fd();
      stream = pump_stream(connection, settings);
      connection.fd.reset();
      // Output closed is not exit: a payload may close stdout and stderr and keep running. One
      // whose output closed just before the deadline is given a moment to be seen exiting.
      if (stream.end == StreamEnd::closed &&
          !wait_for_exit(api, container, std::max(until(deadline), kExitSlack)))
        stream.end = StreamEnd::deadline;
      if (stream.end != StreamEnd::closed) stop_container(api, container, policy.limits.kill_grace);
      usage = sampler.finish();

      auto state = inspect_state(api, container);
      // Docker learns of an OOM kill from an asynchronous event: a SIGKILL we did not send may
      // be reported before State.OOMKilled is set, and the cgroup may be gone before the
      // sampler saw it. Ask again for a moment before calling it a plain signal.
      for (int retry = 0; retry < 10 && stream.end == StreamEnd::closed && !state.oom_killed &&
                          !usage.oom_kills.value_or(0) && state.exit_code == 128 + SIGKILL;
           ++retry) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        state = inspect_state(api, container);
      }
      termination.exit_code = state.exit_code;
      termination.oom_killed = state.oom_killed || usage.oom_kills.value_or(0) > 0;
    } catch (const DaemonError& error) {
      if (stream.caller_error) std::rethrow_exception(stream.caller_error);
      return run.setup_failed(error.what());
    }
    const auto caller_error = stream.caller_error;
    {
      std::lock_guard lock(live_egress->mutex);
      live_egress->proxy = nullptr;  // a caller's counters and narrowing reach it no more
    }
    run.fill_from(run_end(std::move(stream), termination, usage, policy, run.wall_limit));
    // Without userns-remap the payload runs as a uid of the daemon's host (health says so too).
    if (policy.namespaces.user && !info.traits.remaps_users)
      run.result.unenforced.push_back("namespaces.user");
    if (cpu_unwatched) {
      run.result.unenforced.push_back("limits.cpu_time_ms");
      supervisor::add_note(
          run.result,
          "note: the container's cgroup is not readable from here, so "
          "limits.cpu_time_ms bounded each process (RLIMIT_CPU), not the container");
    }
    if (auto problem = remover.remove(); !problem.empty())
      supervisor::add_note(run.result, "the container could not be removed: " + problem);
    if (holder) {
      std::string problem;
      run.result.network = holder->finish(problem);
      if (!problem.empty())
        supervisor::add_note(
            run.result,
            "the network namespace's holder container could not be removed: " + problem);
    }
    // Rethrown only now: the container is removed first.
    if (caller_error) std::rethrow_exception(caller_error);
    return run.finish();
  }
};

}  // namespace

void require_runnable(const Request& request) {
  if (!http::available())
    throw NeedsFullBinary(
        "the docker backend needs the HTTP client, which this build of rlm-sandbox leaves out");
  if (request.payload_stdio != std::array<int, 3>{-1, -1, -1})
    throw Error(
        "Request.payload_stdio: the docker backend does not support the caller's fds as the "
        "payload's stdio (not supported); use the namespace or local backend");
  if (!request.inherit_fds.empty())
    throw Error(
        "Request.inherit_fds: the docker backend cannot pass file descriptors into a container; "
        "use the namespace or local backend");
}

std::unique_ptr<Backend> make_docker_backend() {
  return std::make_unique<DockerBackend>();
}

}  // namespace rlm::docker
