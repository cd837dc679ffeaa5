#include "session/worker_session.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "broker/routing.hpp"
#include "host/context_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "rlm_sandbox/units.hpp"
#include "rlm_sys/sys.hpp"
#include "session/cell.hpp"
#include "session/frame_fields.hpp"
#include "session/rendezvous.hpp"
#include "session/worker_source.hpp"

namespace rlm::session {
namespace {

using Clock = std::chrono::steady_clock;
using host::UniqueFd;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr int kFirstSandboxFd = 10;  // above init's 0-3 and anything a host keeps low
constexpr std::size_t kWorkerStderrKept = 16 * 1024;
constexpr std::size_t kWorkerErrorKept = 1024;  // of a failed hand-over's error text
// After close, the interpreters exit on EOF and the worker's root once it has no children; what
// a cell left running in the background is stopped with the sandbox after this long.
constexpr milliseconds kGracefulEnd{3'000};

Error system_error(const char* what) {
  return Error(std::string(what) + ": " + sys::errno_text(errno));
}

UniqueFd raised(UniqueFd fd) {
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstSandboxFd);
  if (moved < 0) throw system_error("fcntl(F_DUPFD_CLOEXEC)");
  return UniqueFd(moved);
}

// The hand-over's `options`: what the REPL's globals are (docs/control-channel.md).
json repl_options(const SessionOptions& options) {
  return {{"echo", options.echo_expression}, {"tools", tools_to_json(options.tools)}};
}

// Whether `fd` is a connected unix stream socket: the only thing a fork frame may carry.
bool is_unix_stream(int fd) {
  struct stat status;
  if (fstat(fd, &status) != 0 || !S_ISSOCK(status.st_mode)) return false;
  int domain = 0, type = 0;
  socklen_t length = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0 || domain != AF_UNIX)
    return false;
  length = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0 && type == SOCK_STREAM;
}

bool wait_readable(int fd, milliseconds timeout) {
  pollfd ready{fd, POLLIN, 0};
  int result;
  while ((result = poll(&ready, 1, static_cast<int>(timeout.count()))) < 0 && errno == EINTR) {
  }
  return result > 0;
}

}  // namespace

Handover prepare_handover(SessionOptions options) {
  validate_tools(options.tools);
  if (options.llm) options.llm = limit_llm_handler(std::move(options.llm), options.llm_limits);
  Handover handover;
  if (!options.context_file.empty() || !options.context.empty() || options.context_is_json)
    handover.context = host::open_context_fd(options.context_file, options.context);
  handover.options = std::move(options);
  return handover;
}

std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             SessionOptions options) {
  return open_worker_session(backend, policy, prepare_handover(std::move(options)));
}

std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             Handover handover) {
  auto session = std::make_unique<WorkerSession>(backend, policy, handover.options);
  session->hand_over(std::move(handover));
  return session;
}

WorkerSession::WorkerSession(Backend& backend, const Policy& policy, const SessionOptions& start)
    : backend_(backend),
      name_(backend.name()),
      policy_(policy),
      save_identity_(save_identity(policy)),
      options_(start),
      cell_limit_(policy.limits.wall_time),
      answers_(std::make_shared<broker::AnswerQueue>()),
      run_(std::make_shared<RunState>()) {
  if (!run_->done) throw system_error("eventfd");
  options_.llm = nullptr;  // nothing of a caller before the hand-over
  options_.context.clear();
  options_.context_file.clear();
  policy_.limits.wall_time = options_.lifetime;
  run_ends_ = Clock::now() + options_.lifetime;
  this->start();
}

void WorkerSession::hand_over(Handover handover) {
  if (handed_over_) throw Error("the session has been handed over already");
  handed_over_ = true;
  require_alive();
  options_ = std::move(handover.options);
  if (!stopping_) {
    arm_stop(options_.lifetime);
    lifetime_armed_ = true;
  }
  try {
    own_checkpoint_.set_max_frame(options_.max_frame_bytes);
    standby_.set_max_frame(options_.max_frame_bytes);
    json message = {{"op", "handover"},
                    {"id", 0},
                    {"max_frame", options_.max_frame_bytes},
                    {"context", nullptr},
                    {"options", repl_options(options_)}};
    if (handover.context) message["context"] = options_.context_is_json ? "json" : "text";
    // The standby applies it now and answers; the checkpoint keeps it, and applies it only
    // before it forks again (a rollback of the first cell, a restore of a snapshot of it).
    const int fd = handover.context ? handover.context.get() : -1;
    if (!own_checkpoint_.send(message, fd) || !standby_.send(message, fd))
      fail("the worker is gone");
    handover.context.reset();
    const auto reply = next_frame_or_fail(standby_, "handed_over", options_.start_timeout);
    if (text_field(reply, "type") != "handed_over" || field(reply, "id") != json(0))
      fail("expected the standby's handed_over, got " + describe_frame(reply));
    if (const auto& error = field(reply, "error"); error.is_string())
      fail(error.get<std::string>().substr(0, kWorkerErrorKept));
  } catch (const Error& error) {
    if (!closed_) abandon();
    throw Error(std::string("the session could not start: ") + error.what());
  }
}

bool WorkerSession::waiting() const {
  if (handed_over_ || !ended_.empty() || closed_ || !own_checkpoint_) return false;
  if (!standby_) return false;
  // Neither interpreter says anything before the hand-over: a frame (a rollback of a standby that
  // died) or EOF means the session is not as started.
  pollfd fds[3] = {
      {own_checkpoint_.fd(), POLLIN, 0}, {standby_.fd(), POLLIN, 0}, {run_->done.get(), POLLIN, 0}};
  if (poll(fds, 3, 0) < 0) return false;
  return fds[0].revents == 0 && fds[1].revents == 0 && fds[2].revents == 0 &&
         own_checkpoint_.unread() == 0 && standby_.unread() == 0;
}

WorkerSession::~WorkerSession() {
  try {
    close();
  } catch (...) {
  }
}

CellResult WorkerSession::execute(const std::string& code, const ExecuteOptions& options) {
  require_alive();
  const auto& timeout = options.timeout;
  if (timeout && *timeout > cell_limit_)
    throw Error("a cell timeout of " + format_duration(*timeout) +
                " is above the policy's limits.wall_time_ms of " + format_duration(cell_limit_));
  json op = {{"op", "execute"}, {"code", code}, {"output_cap", policy_.limits.output_bytes}};
  if (options.locals) op["locals"] = true;
  if (options.fetch) op["fetch"] = *options.fetch;
  return Cell(*this, std::move(op), timeout.value_or(cell_limit_)).run();
}

CellResult WorkerSession::add_context(ContextKind kind, const ContextInput& input,
                                      std::optional<std::size_t> index) {
  require_alive();
  const UniqueFd fd = host::open_context_fd(input.file, input.data);
  json op = {{"op", "add_context"},
             {"index", index ? json(*index) : json()},
             {"kind", kind == ContextKind::context ? "context" : "history"},
             {"format", input.is_json ? "json" : "text"}};
  return Cell(*this, std::move(op), cell_limit_, fd.get()).run();
}

WorkerSession::SealedState WorkerSession::save_state() {
  require_alive();
  SealedState sealed;
  sealed.fd = UniqueFd(memfd_create("rlm-sandbox-saved-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!sealed.fd) throw Error("memfd_create: " + sys::errno_text(errno));
  // Sparse room for the state, written through a mapping (the sandbox's file size limit would
  // stop write()): as much as the session's memory may hold, which its pages are charged to.
  const std::uint64_t room =
      policy_.limits.memory_bytes > 0
          ? std::min<std::uint64_t>(policy_.limits.memory_bytes, kMaxSavedStateBytes)
          : kMaxSavedStateBytes;
  if (ftruncate(sealed.fd.get(), static_cast<off_t>(room)) != 0)
    throw Error("ftruncate: " + sys::errno_text(errno));
  sealed.result = Cell(*this, {{"op", "save"}}, cell_limit_, sealed.fd.get()).run();
  if (sealed.result.status != CellStatus::ok) return sealed;
  json saved = sealed.result.saved.value_or(json::object());
  const json used = saved.value("used", json());
  saved.erase("used");
  if (!saved.contains("skipped")) saved["skipped"] = json::array();
  sealed.result.saved = std::move(saved);
  if (!used.is_number_unsigned() || used.get<std::uint64_t>() > room)
    fail("the sandbox's save did not say how much of its room it used");
  // The sandbox's bytes: cut to what it used and sealed before they are read, so nothing it
  // kept can change them then.
  if (ftruncate(sealed.fd.get(), static_cast<off_t>(used.get<std::uint64_t>())) != 0)
    throw Error("ftruncate: " + sys::errno_text(errno));
  sealed.size = seal_state(sealed.fd.get());
  if (sealed.size != used.get<std::uint64_t>())
    throw Error("the saved state changed size while it was sealed");
  return sealed;
}

std::uint64_t WorkerSession::state_room() const {
  return policy_.limits.memory_bytes > 0
             ? std::min<std::uint64_t>(policy_.limits.memory_bytes, kMaxSavedStateBytes)
             : kMaxSavedStateBytes;
}

CellResult WorkerSession::save_to_fd(int fd) {
  SealedState sealed = save_state();
  if (sealed.result.status != CellStatus::ok) return sealed.result;
  struct Release {
    int fd;
    ~Release() { release_state(fd); }
  } const release{sealed.fd.get()};
  (*sealed.result.saved)["bytes"] =
      write_save_file(fd, sealed.fd.get(), sealed.size, save_identity_);
  return sealed.result;
}

CellResult WorkerSession::load_from_fd(int fd) {
  require_alive();
  const SavedState state = read_save_file(fd, save_identity_, state_room());
  CellResult result = load_state(state.fd.get(), state.offset);
  release_state(state.fd.get());  // a sealed memfd of the caller's own is left as it is
  return result;
}

CellResult WorkerSession::load_state(int fd, std::uint64_t offset) {
  require_alive();
  return Cell(*this, {{"op", "load"}, {"offset", offset}}, cell_limit_, fd).run();
}

SnapshotId WorkerSession::snapshot() {
  require_alive();
  await_standby();
  if (checkpoint_snapshot_) return *checkpoint_snapshot_;
  const auto id = next_id_++;
  checkpoint_ = &snapshots_.emplace(id, std::move(own_checkpoint_)).first->second;
  checkpoint_snapshot_ = id;
  return id;
}

void WorkerSession::restore(SnapshotId id) {
  require_alive();
  const auto snapshot = snapshots_.find(id);
  if (snapshot == snapshots_.end())
    throw Error("no snapshot " + std::to_string(id) + " in this session");
  await_standby();
  release_checkpoint();  // first, so its standby's exit below does not read as a crash
  standby_.send({{"op", "discard"}});
  standby_.close();
  checkpoint_ = &snapshot->second;
  checkpoint_snapshot_ = id;
  send_or_end(*checkpoint_, {{"op", "restore"}, {"id", id}});
  await_standby(id);
}

Result WorkerSession::close() {
  if (!closed_) {
    closed_ = true;
    if (ended_.empty()) ended_ = "the session was closed";
    // EOF on every channel: each interpreter exits; the worker's root follows once it has no
    // children left. Whatever a cell left running is stopped with the run.
    close_channels();
    if (!wait_readable(run_->done.get(), kGracefulEnd)) stop_run();
    if (run_thread_.joinable()) run_thread_.join();
  }
  std::lock_guard lock(run_->mutex);
  if (run_->result) return *run_->result;
  Result failed;
  failed.backend = name_;
  failed.policy = policy_.name;
  failed.detail = run_->failure;
  return failed;
}

void WorkerSession::start() {
  const bool by_socket = !backend_.can_inherit_fds();
  UniqueFd host, sandbox;
  if (by_socket) {
    rendezvous_ = std::make_unique<Rendezvous>(options_);
    policy_.filesystem.mounts.push_back(rendezvous_->mount());
  } else {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      throw system_error("socketpair");
    host.reset(pair[0]);
    sandbox = raised(UniqueFd(pair[1]));
  }
  stop_timer_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!stop_timer_) throw system_error("timerfd_create");
  const std::string token = random_token();

  Request request;
  request.argv = {"python3", "-I", "-S", "-c", std::string(worker_source())};
  request.bind_owner = options_.bind_owner;
  request.env = {{"RLM_SANDBOX_TOKEN", token},
                 {"RLM_SANDBOX_MAX_FRAME", std::to_string(options_.max_frame_bytes)}};
  if (by_socket) {
    request.env["RLM_SANDBOX_SOCKET"] = rendezvous_->socket_inside();
  } else {
    request.env["RLM_SANDBOX_FD"] = std::to_string(sandbox.get());
    request.inherit_fds = {sandbox.get()};
  }
  start_run(std::move(request));

  const auto deadline = Clock::now() + options_.start_timeout;
  std::optional<json> hello;
  try {
    if (by_socket) {
      hello = rendezvous_->accept_hello(token, run_->done.get(), deadline, own_checkpoint_);
    } else {
      own_checkpoint_ = Channel(std::move(host), options_.max_frame_bytes);
      hello = next_frame_until(own_checkpoint_, deadline);
    }
    checkpoint_ = &own_checkpoint_;
  } catch (const Error& error) {
    ended_ = error.what();
  }
  // The sandbox has its copy (or is gone): ours would only hide its end of the channel.
  sandbox.reset();
  if (!hello || text_field(*hello, "type") != "hello" ||
      !same_token(text_field(*hello, "token"), token)) {
    std::string why = ended_;
    if (why.empty())
      why = !hello ? "the worker did not say hello"
                   : "the worker's first frame was not a hello with the session token";
    abandon();
    throw Error("the session could not start: " + why + run_summary());
  }
  await_standby(0);  // the first checkpoint and its standby, before any caller
}

// The worker's run, on a thread of its own: the policy's limits, the session's lifetime as its
// wall time, its stderr kept for error messages, its cgroup counters for the cells.
void WorkerSession::start_run(Request request) {
  request.stop_fd = stop_timer_.get();
  request.guard_signals = true;  // a cell must not signal its checkpoints (docs/sessions.md)
  request.stop_at_process_limit = false;  // a cell at the limit fails alone (request.hpp)
  // The sandbox outlives many cells, each held to the policy's limits on its own: its total CPU
  // time is bounded only by the session's lifetime on every CPU.
  request.sandbox_cpu_time = options_.lifetime * std::max(1u, std::thread::hardware_concurrency());
  request.on_stdout = [](std::string_view) {};  // outside a cell nothing is expected there
  request.on_stderr = [run = run_](std::string_view text) {
    std::lock_guard lock(run->mutex);
    auto& kept = run->worker_stderr;
    kept.append(text);
    if (kept.size() > kWorkerStderrKept) kept.erase(0, kept.size() - kWorkerStderrKept);
  };
  request.on_started = [run = run_](RunningSandbox running) {
    std::lock_guard lock(run->mutex);
    run->running = std::move(running);
  };

  run_thread_ = std::thread([this, request = std::move(request), run = run_]() mutable {
    std::optional<Result> result;
    std::string failure;
    try {
      result = backend_.run(request, policy_);
    } catch (const std::exception& error) {
      failure = error.what();
    }
    {
      std::lock_guard lock(run->mutex);
      run->result = std::move(result);
      run->failure = std::move(failure);
      run->running = {};
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t ignored = write(run->done.get(), &one, sizeof one);
  });
}

std::string WorkerSession::run_summary() {
  std::string summary;
  if (lifetime_ran_out())
    summary = "; the session's lifetime of " + format_duration(options_.lifetime) + " ran out";
  std::lock_guard lock(run_->mutex);
  if (run_->result && !run_->result->detail.empty())
    summary += "; the sandbox: " + run_->result->detail;
  if (!run_->failure.empty()) summary += "; " + run_->failure;
  if (!run_->worker_stderr.empty()) summary += "; the worker's stderr: " + run_->worker_stderr;
  return summary;
}

std::string WorkerSession::end_reason(const std::string& seen) const {
  std::lock_guard lock(kill_mutex_);
  return killed_.empty() ? seen : killed_;
}

void WorkerSession::kill(const std::string& why) {
  {
    std::lock_guard lock(kill_mutex_);
    if (!killed_.empty()) return;
    killed_ = why.empty() ? "killed" : why;
  }
  // The timer is the run's stop_fd: the sandbox ends, and the thread in a cell sees it end.
  arm_stop(std::chrono::nanoseconds(0));
}

bool WorkerSession::lifetime_ran_out() const {
  {
    std::lock_guard lock(kill_mutex_);
    if (!killed_.empty()) return false;
  }
  if (stopping_) return lifetime_over_;
  itimerspec left{};
  return lifetime_armed_ && timerfd_gettime(stop_timer_.get(), &left) == 0 &&
         left.it_value.tv_sec == 0 && left.it_value.tv_nsec == 0;
}

std::string WorkerSession::run_end_detail() {
  {
    std::lock_guard lock(kill_mutex_);
    if (!killed_.empty()) return ": " + killed_;
  }
  if (lifetime_ran_out())
    return ": the session's lifetime of " + format_duration(options_.lifetime) + " ran out";
  std::lock_guard lock(run_->mutex);
  return run_->result ? ": " + run_->result->detail : std::string();
}

void WorkerSession::arm_stop(std::chrono::nanoseconds after) {
  using std::chrono::duration_cast;
  using std::chrono::seconds;
  itimerspec when{};
  after = std::max(after, std::chrono::nanoseconds(1));  // 0 would disarm it
  when.it_value.tv_sec = duration_cast<seconds>(after).count();
  when.it_value.tv_nsec = (after - duration_cast<seconds>(after)).count();
  timerfd_settime(stop_timer_.get(), 0, &when, nullptr);
}

void WorkerSession::stop_run() {
  if (stopping_) return;
  lifetime_over_ = lifetime_ran_out();  // before the timer is fired again, by us
  stopping_ = true;
  arm_stop(std::chrono::nanoseconds(0));
}

void WorkerSession::close_channels() {
  standby_.close();
  own_checkpoint_.close();
  snapshots_.clear();
  checkpoint_ = &own_checkpoint_;
  checkpoint_snapshot_.reset();
}

void WorkerSession::abandon() {
  closed_ = true;
  close_channels();
  stop_run();
  if (run_thread_.joinable()) run_thread_.join();
}

void WorkerSession::fail(const std::string& why) {
  const std::string reason = end_reason(why);
  if (ended_.empty()) ended_ = reason;
  abandon();
  throw Error("the session ended: " + reason + run_summary());
}

void WorkerSession::require_alive() const {
  if (!ended_.empty()) throw Error("the session has ended: " + ended_);
}

void WorkerSession::send_or_end(Channel& channel, const json& message) {
  if (!channel.send(message)) fail("the sandboxed interpreter is gone");
}

std::optional<json> WorkerSession::next_frame_until(Channel& channel, Clock::time_point deadline) {
  for (;;) {
    if (auto frame = channel.next_frame()) return frame;
    const int timeout = sys::poll_timeout_ms(deadline);  // what is left, plus 1 ms
    if (timeout <= 1) return std::nullopt;
    const short events = POLLIN | (channel.unsent() ? POLLOUT : 0);
    pollfd fds[2] = {{channel.fd(), events, 0}, {run_->done.get(), POLLIN, 0}};
    if (poll(fds, 2, timeout) < 0 && errno != EINTR) return std::nullopt;
    if (fds[0].revents & POLLOUT) channel.flush();  // a peer gone shows as EOF below
    if (fds[0].revents & ~POLLOUT) {
      if (!channel.receive()) {
        if (auto frame = channel.next_frame()) return frame;
        return std::nullopt;
      }
    } else if (fds[1].revents) {
      return std::nullopt;
    }
  }
}

void WorkerSession::await_standby(std::optional<SnapshotId> id, milliseconds bound) {
  if (standby_) {
    // A standby that died idle: its checkpoint has said so (rolled_back) without being asked.
    if (!checkpoint_->receive()) fail("the checkpoint interpreter is gone");
    std::optional<json> pending;
    try {
      pending = checkpoint_->next_frame();
    } catch (const Error& error) {
      fail(error.what());
    }
    if (!pending) return;
    if (text_field(*pending, "type") != "rolled_back")
      fail("unexpected frame from the checkpoint interpreter: " + describe_frame(*pending));
    standby_.close();
  }
  for (;;) {
    auto frame = next_frame_or_fail(*checkpoint_, "fork", bound);
    const auto type = text_field(frame, "type");
    if (type == "rolled_back") continue;  // a standby that died idle; its replacement follows
    if (type != "fork" || (id && field(frame, "id") != json(*id)))
      fail("expected a fork frame, got " + describe_frame(frame));
    auto fd = checkpoint_->take_fd();
    if (!fd) fail("the fork frame carried no channel (exactly one fd on its first byte)");
    if (!is_unix_stream(fd.get())) fail("the fork frame's fd is not a unix stream socket");
    standby_ = Channel(std::move(fd), options_.max_frame_bytes);
    return;
  }
}

void WorkerSession::release_checkpoint() {
  if (checkpoint_snapshot_) {
    checkpoint_->send({{"op", "commit"}});
  } else {
    own_checkpoint_.send({{"op", "discard"}});
    own_checkpoint_.close();
  }
}

json WorkerSession::next_frame_or_fail(Channel& channel, std::string_view expected,
                                       milliseconds bound) {
  std::optional<json> frame;
  try {
    frame = next_frame_until(channel, Clock::now() + bound);
  } catch (const Error& error) {
    fail(error.what());
  }
  if (!frame) fail("no " + std::string(expected) + " from the sandboxed interpreter");
  return std::move(*frame);
}

LiveCounters WorkerSession::counters() {
  std::function<LiveCounters()> probe;
  {
    std::lock_guard lock(run_->mutex);
    probe = run_->running.counters;
  }
  return probe ? probe() : LiveCounters{};
}

void WorkerSession::narrow_network(const std::vector<std::string>& entries) {
  require_alive();
  std::function<void(const Egress&)> narrow;
  {
    std::lock_guard lock(run_->mutex);
    narrow = run_->running.narrow_network;
  }
  if (policy_.network != Network::allowlist || !narrow)
    throw Error(std::string("narrow_network: this session has no egress allowlist to narrow (its "
                            "network is ") +
                (policy_.network == Network::none ? "none: it has no network at all)"
                                                  : "the host's, which a running sandbox cannot "
                                                    "be put behind an allowlist from)"));
  // Checked against the list as it is now (an earlier narrowing's), so each one only narrows.
  Policy narrowed = rlm::narrow_network(policy_, entries, "narrow_network");
  narrow(narrowed.egress);
  policy_.egress = std::move(narrowed.egress);
}

}  // namespace rlm::session
