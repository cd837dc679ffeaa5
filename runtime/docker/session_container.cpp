#include "docker/session_container.hpp"

#include <algorithm>
#include <thread>

#include "cgroup/usage.hpp"
#include "common/environment.hpp"
#include "common/run_start.hpp"
#include "docker/attached_stream.hpp"
#include "docker/container_control.hpp"
#include "docker/container_spec.hpp"
#include "docker/daemon_info.hpp"
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

const std::vector<std::string> kKeepAlive = {"/bin/sh", "-c", "while :; do sleep 3600; done"};

std::string socket_or_throw(const Endpoint& endpoint) {
  if (!endpoint.problem.empty()) throw BackendUnavailable(endpoint.problem);
  return endpoint.socket_path;
}

struct ExecState {
  bool running = true;
  std::optional<int> exit_code;
};

ExecState inspect_exec(const EngineApi& api, const std::string& exec_id) {
  const auto inspected = api.expect_json("GET", "/exec/" + exec_id + "/json");
  ExecState state;
  state.running = inspected.value("Running", false);
  if (inspected.contains("ExitCode") && inspected["ExitCode"].is_number_integer())
    state.exit_code = inspected["ExitCode"].get<int>();
  return state;
}

// The exec's stream closes as its process ends; the daemon marks it finished a moment later.
std::optional<ExecState> wait_for_exec(const EngineApi& api, const std::string& exec_id,
                                       Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    auto state = inspect_exec(api, exec_id);
    if (!state.running) return state;
    if (Clock::now() + pause >= deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace

struct DockerSessionContainer::Container {
  std::string id;
  std::optional<cgroup::UsageReader> cgroup;  // for usage and OOM kills, when readable here
  std::atomic<bool> retired{false};
  std::atomic<bool> stopped_over_limit{false};
};

DockerSessionContainer::DockerSessionContainer(Policy policy, std::string session_id)
    : policy_(std::move(policy)),
      session_id_(session_id.empty() ? "session-" + new_owned_id() : std::move(session_id)),
      api_(socket_or_throw(endpoint_from_environment())) {
  require_runnable(Request{});
  if (auto problem = socket_problem(api_.socket_path()); !problem.empty())
    throw BackendUnavailable(problem);
  DaemonInfo info;
  try {
    info = daemon_info(api_);
  } catch (const DaemonError& error) {
    throw BackendUnavailable(error.what());
  }
  require_supported(policy_, info.traits);
  collect_stale_containers_once(api_);
}

DockerSessionContainer::~DockerSessionContainer() {
  close();
}

std::string DockerSessionContainer::container_id() const {
  std::lock_guard lock(mutex_);
  return current_ ? current_->id : std::string();
}

std::shared_ptr<DockerSessionContainer::Container> DockerSessionContainer::acquire() {
  std::lock_guard lock(mutex_);
  if (closed_) throw Error("the docker session " + session_id_ + " is closed");
  if (current_ && !current_->retired) return current_;

  // Created under the lock: a burst of first runs shares one container.
  const std::string owner = new_owned_id();
  ContainerPlan plan;
  plan.command = kKeepAlive;
  plan.environment = common::payload_environment(policy_.env, {});
  plan.session = session_id_;
  plan.owner = owner;
  ContainerRemover remover(api_);
  auto container = std::make_shared<Container>();
  container->id = create_container(api_, create_body(policy_, plan), "rlm-sandbox-" + owner);
  remover.hold(container->id);
  start_container(api_, container->id);
  container->cgroup =
      cgroup::UsageReader::of_process(inspect_state(api_, container->id).pid, container->id);
  remover.hold("");
  current_ = container;
  return container;
}

void DockerSessionContainer::retire(const std::shared_ptr<Container>& container,
                                    bool stop_first) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (current_ == container) current_.reset();
  }
  if (container->retired.exchange(true)) return;  // another run or close() is on it
  if (stop_first) {
    container->stopped_over_limit = true;
    try {
      stop_container(api_, container->id, policy_.limits.kill_grace);
    } catch (...) {
      // The forced removal below kills whatever is left.
    }
  }
  remove_container(api_, container->id);
}

void DockerSessionContainer::close() noexcept {
  std::shared_ptr<Container> container;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    container = std::move(current_);
  }
  if (container) retire(container, /*stop_first=*/false);
}

Result DockerSessionContainer::run(const Request& request) {
  require_runnable(request);
  common::RunStart run("docker", request, policy_);
  const auto deadline = run.deadline();

  const bool open_stdin = wants_stdin(request);
  const nlohmann::json exec_body = {
      {"AttachStdin", open_stdin},
      {"AttachStdout", true},
      {"AttachStderr", true},
      {"Tty", false},
      {"Cmd", run.argv},
      {"Env", run.environment},
      {"User", std::to_string(policy_.user.uid) + ":" + std::to_string(policy_.user.gid)},
      {"WorkingDir", policy_.filesystem.workdir.empty() ? "/" : policy_.filesystem.workdir},
  };

  std::shared_ptr<Container> container;
  std::string exec_id;
  try {
    // A container that died under us (stopped over another run's limit, removed from outside)
    // is replaced once.
    for (int attempt = 0; exec_id.empty(); ++attempt) {
      container = acquire();
      const std::string path = "/containers/" + container->id + "/exec";
      const auto reply = api_.call("POST", path, &exec_body);
      if (reply.ok()) {
        exec_id = reply.json().value("Id", std::string());
        if (exec_id.empty()) throw DaemonError("the Docker daemon did not say the exec's id");
      } else if ((reply.status == 409 || reply.status == 404) && attempt == 0) {
        retire(container, /*stop_first=*/false);
      } else {
        throw api_.failure("POST", path, reply);
      }
    }
  } catch (const DaemonError& error) {
    return run.setup_failed(error.what());
  }

  StreamOutcome stream;
  Termination termination;
  CgroupReading usage;
  bool stopped_it = false;
  try {
    const auto before =
        container->cgroup ? StatsSampler::read(*container->cgroup) : CgroupReading{};
    const double exec_started = unix_time_now();
    auto connection = open_hijacked(api_.socket_path(), "POST", "/exec/" + exec_id + "/start",
                                    nlohmann::json{{"Detach", false}, {"Tty", false}}.dump(),
                                    std::chrono::seconds(30));
    if (request.on_started) request.on_started([] { return LiveCounters{}; });

    // The container's CPU time from here on (concurrent executions count too), against the
    // execution's limits.cpu_time_ms: past it the container is stopped, as for the other limits.
    termination.cpu_budget = request.sandbox_cpu_time.value_or(policy_.limits.cpu_time);
    std::optional<StatsSampler> sampler;
    if (container->cgroup && before.cpu_nanoseconds)
      sampler.emplace(container->cgroup, termination.cpu_budget, *before.cpu_nanoseconds);
    auto settings = stream_settings(request, policy_, deadline);
    if (sampler) settings.limit_fd = sampler->limit_fd();
    stream = pump_stream(connection, settings);
    connection.fd.reset();
    const auto sampled = sampler ? sampler->finish() : CgroupReading{};

    if (stream.end == StreamEnd::closed) {
      // One whose output closed just before the deadline is given a moment to be seen exiting.
      if (auto state = wait_for_exec(api_, exec_id, std::max(deadline, Clock::now() + kExitSlack)))
        termination.exit_code = state->exit_code;
      else
        stream.end = StreamEnd::deadline;
    }
    if (stream.end != StreamEnd::closed) {
      // Docker cannot stop an exec's process tree on its own: the container goes, as a whole.
      stopped_it = !container->retired;
      retire(container, /*stop_first=*/true);
      if (stream.end == StreamEnd::cpu_limit && sampled.cpu_nanoseconds)
        usage.cpu_nanoseconds =
            *sampled.cpu_nanoseconds - std::min(*sampled.cpu_nanoseconds, *before.cpu_nanoseconds);
    } else {
      usage = container->cgroup ? StatsSampler::read(*container->cgroup) : CgroupReading{};
      // The container's CPU time during this execution (concurrent ones on the session count
      // too); its peak memory is the session's so far.
      if (usage.cpu_nanoseconds && before.cpu_nanoseconds)
        usage.cpu_nanoseconds =
            *usage.cpu_nanoseconds - std::min(*usage.cpu_nanoseconds, *before.cpu_nanoseconds);
      else
        usage.cpu_nanoseconds.reset();
      if (termination.exit_code == 137) {
        termination.oom_killed =
            usage.oom_kills && before.oom_kills
                ? *usage.oom_kills > *before.oom_kills
                : oom_event_since(api_, container->id, exec_started);  // no cgroup view here
      }
    }
    termination.stopped_by_another = container->stopped_over_limit && !stopped_it;
  } catch (const DaemonError& error) {
    if (stream.caller_error) std::rethrow_exception(stream.caller_error);
    // Its exec vanished with the container another run stopped: say that, not the 404.
    if (container->stopped_over_limit && !stopped_it)
      return run.setup_failed(
          "the session's container was stopped because another execution on it hit a limit");
    return run.setup_failed(error.what());
  }
  const auto caller_error = stream.caller_error;
  fill_result(run.result, std::move(stream), termination, usage, policy_, run.wall_limit);
  if (caller_error) std::rethrow_exception(caller_error);
  return run.finish();
}

}  // namespace rlm::docker
