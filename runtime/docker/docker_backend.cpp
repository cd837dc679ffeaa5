// The docker backend's one-shot run. Phases: prepare (policy checks, daemon info, the create
// body: everything that may fail with a message, before any container exists), create and attach
// before start (so no output is missed and stdin is connected), stream until the payload's output
// closes or a limit or the deadline hits, stop the container as a whole when needed, read its
// state, remove it -- whatever happened.
#include "docker/docker_backend.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cgroup/usage.hpp"
#include "common/run_start.hpp"
#include "docker/attached_stream.hpp"
#include "docker/container_control.hpp"
#include "docker/container_spec.hpp"
#include "docker/daemon_info.hpp"
#include "docker/health.hpp"
#include "docker/hijack.hpp"
#include "docker/leftovers.hpp"
#include "docker/ownership.hpp"
#include "docker/request_checks.hpp"
#include "docker/run_outcome.hpp"
#include "docker/stats_sampler.hpp"

namespace rlm::docker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kExitSlack{250};

std::chrono::milliseconds until(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
}

// Starts the container. Without Docker's init the runtime itself execs the payload, and a
// command it cannot find fails the start: returns Docker's message then ("" when it started).
std::string start_or_not_found(const EngineApi& api, const std::string& container) {
  try {
    start_container(api, container);
    return "";
  } catch (const DaemonError& error) {
    const std::string message = error.what();
    if (error.status() == 400 && (message.find("executable file not found") != std::string::npos ||
                                  message.find("no such file or directory") != std::string::npos))
      return message;
    throw;
  }
}

// The Result the other backends give for a command that is not there: exit 127.
void fill_not_found(Result& result, const std::string& message) {
  result.status = Status::exit_nonzero;
  result.exit_code = 127;
  result.signal = 0;
  result.detail = "cannot execute the command: " + message;
}

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
    common::RunStart run("docker", request, policy);
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
    ContainerPlan plan;
    plan.command = run.argv;
    plan.environment = std::move(run.environment);
    plan.open_stdin = wants_stdin(request);
    plan.session = id;
    plan.owner = id;
    const auto body = create_body(policy, plan);

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
      if (auto not_found = start_or_not_found(api, container); !not_found.empty()) {
        fill_not_found(run.result, not_found);
        return run.finish();  // the remover takes the container
      }
      // A payload that is already gone has no cgroup left to read: its usage is not available.
      const auto running = inspect_state(api, container);
      auto cgroup = cgroup::UsageReader::of_process(running.pid, container);
      // A daemon whose containers this process cannot see (another PID namespace, a remote
      // host): only Ulimits' RLIMIT_CPU, per process, holds the CPU time.
      cpu_unwatched = !cgroup && running.pid > 0;
      // A session asks before and after each cell how many OOM kills its container has seen, to
      // tell a cell the OOM killer took (memory_limit) from one that crashed. The files are read
      // by path: once the container is gone they simply answer nothing.
      if (request.on_started)
        request.on_started([cgroup] { return cgroup ? cgroup->live() : LiveCounters{}; });
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
    fill_result(run.result, std::move(stream), termination, usage, policy, run.wall_limit);
    if (cpu_unwatched) {
      run.result.unenforced.push_back("limits.cpu_time_ms");
      run.result.detail +=
          std::string(run.result.detail.empty() ? "" : "; ") +
          "note: the container's cgroup is not readable from here, so "
          "limits.cpu_time_ms bounded each process (RLIMIT_CPU), not the container";
    }
    if (auto problem = remover.remove(); !problem.empty())
      run.result.detail += std::string(run.result.detail.empty() ? "" : "; ") +
                           "the container could not be removed: " + problem;
    // Rethrown only now: the container is removed first.
    if (caller_error) std::rethrow_exception(caller_error);
    return run.finish();
  }
};

}  // namespace

std::unique_ptr<Backend> make_docker_backend() {
  return std::make_unique<DockerBackend>();
}

}  // namespace rlm::docker
