// The session every backend that can pass an fd to its payload gets: the Python REPL worker
// (worker/python/rlm_worker.py, embedded) runs as the payload of Backend::run() on a thread of its
// own, and this object drives it over the control channel (docs/control-channel.md): one channel
// per interpreter process; a frozen checkpoint and an idle standby forked from it between cells;
// the standby runs the next cell at once, and a cell that fails hard is rolled back to the
// checkpoint.
#include "session/worker_session.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"
#include "session/channel.hpp"
#include "session/frame_fields.hpp"
#include "session/worker_source.hpp"

namespace rlm::session {
namespace {

using Clock = std::chrono::steady_clock;
using common::UniqueFd;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr int kFirstSandboxFd = 10;           // above init's 0-3 and anything a host keeps low
constexpr milliseconds kAnswerBound{10'000};  // for a frozen interpreter's fork/rollback answer
constexpr std::size_t kWorkerStderrKept = 16 * 1024;
// After close, the interpreters exit on EOF and the worker's root once it has no children; what
// a cell left running in the background is stopped with the sandbox after this long.
constexpr milliseconds kGracefulEnd{3'000};
// While the wall clock is paused for LM answers, how often the sandbox's CPU time is read.
constexpr milliseconds kCpuCheck{50};

std::system_error system_error(const char* what) {
  return std::system_error(errno, std::generic_category(), what);
}

UniqueFd raised(UniqueFd fd) {
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstSandboxFd);
  if (moved < 0) throw system_error("fcntl(F_DUPFD_CLOEXEC)");
  return UniqueFd(moved);
}

std::string random_token() {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    throw system_error("getrandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (const unsigned char byte : bytes) {
    token += kHex[byte >> 4];
    token += kHex[byte & 15];
  }
  return token;
}

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;  // constant time: the comparison does not stop at the first miss
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

UniqueFd context_fd(const SessionOptions& options) {
  if (!options.context_file.empty()) {
    UniqueFd fd(open(options.context_file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
      throw Error("cannot open the context file '" + options.context_file +
                  "': " + std::generic_category().message(errno));
    return raised(std::move(fd));
  }
  if (options.context.empty() && !options.context_is_json) return {};
  UniqueFd fd(memfd_create("rlm-sandbox-context", MFD_CLOEXEC));
  if (!fd) throw system_error("memfd_create");
  for (std::size_t written = 0; written < options.context.size();) {
    const ssize_t count =
        write(fd.get(), options.context.data() + written, options.context.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw system_error("writing the context");
    written += static_cast<std::size_t>(count);
  }
  lseek(fd.get(), 0, SEEK_SET);
  return raised(std::move(fd));
}

std::string describe_exit(const json& rolled_back) {
  const auto small = [](const json& value) {
    return value.is_number_integer() && value.get<std::int64_t>() >= 0 &&
           value.get<std::int64_t>() <= 255;
  };
  if (const auto& signal = field(rolled_back, "signal"); small(signal)) {
    const char* name = sigabbrev_np(signal.get<int>());
    return "the interpreter died of signal " + std::to_string(signal.get<int>()) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  if (const auto& code = field(rolled_back, "exit_code"); small(code))
    return "the interpreter exited with code " + std::to_string(code.get<int>());
  return "the interpreter ended";
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

// LLM answers come back on handler threads; they are queued here and the session's poll loop is
// woken through the eventfd. Shared with the callbacks, so a late answer after the session is
// gone lands harmlessly.
struct AnswerQueue {
  struct Item {
    std::uint64_t generation;
    std::uint64_t call;  // the session's call number
    std::size_t index;   // the item of a batch (0 for a single query)
    LlmAnswer answer;
  };
  std::mutex mutex;
  std::deque<Item> items;
  UniqueFd event{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  // Bytes of prompts handed to the handler and not answered yet, of this cell or an earlier one
  // (a handler that ignores cancellation holds them on): they count against the session's buffer.
  std::atomic<std::uint64_t> at_handler{0};

  // One prompt's bytes, charged while the handler holds the call: released when it answers, or
  // when it drops the callback unanswered.
  class Charge {
   public:
    Charge(std::shared_ptr<AnswerQueue> queue, std::uint64_t bytes)
        : queue_(std::move(queue)), bytes_(bytes) {
      queue_->at_handler += bytes_;
    }
    ~Charge() { release(); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    void release() { queue_->at_handler -= bytes_.exchange(0); }

   private:
    std::shared_ptr<AnswerQueue> queue_;
    std::atomic<std::uint64_t> bytes_;
  };

  void push(Item item) {
    {
      std::lock_guard lock(mutex);
      items.push_back(std::move(item));
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t ignored = write(event.get(), &one, sizeof one);
  }
  std::deque<Item> take() {
    std::uint64_t count;
    [[maybe_unused]] const ssize_t ignored = read(event.get(), &count, sizeof count);
    std::lock_guard lock(mutex);
    return std::exchange(items, {});
  }
};

// The end of the run thread, seen by the poll loop through an eventfd.
struct RunState {
  std::mutex mutex;
  std::optional<Result> result;
  std::string failure;  // run() threw
  std::string worker_stderr;
  std::function<LiveCounters()> probe;
  UniqueFd done{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
};

// For a backend that cannot pass an fd into the sandbox (Docker): a private directory holding a
// listening socket (and the context as a file), bind-mounted into the sandbox; the worker
// connects, and the first connection that says hello with the session token becomes the channel.
class Rendezvous {
 public:
  static constexpr const char* kInside = "/run/rlm-sandbox";

  explicit Rendezvous(const SessionOptions& options) : max_frame_(options.max_frame_bytes) {
    char pattern[] = "/tmp/rlm-session-XXXXXX";
    if (!mkdtemp(pattern)) throw system_error("mkdtemp");
    dir_ = pattern;
    // The sandbox user (any uid) must reach the socket; other host users cannot list the
    // directory, and a connection without the token is dropped.
    chmod(dir_.c_str(), 0711);
    listener_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!listener_) throw system_error("socket");
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = dir_ + "/channel.sock";
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
    if (bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        chmod(path.c_str(), 0666) != 0 || listen(listener_.get(), 4) != 0)
      throw system_error("binding the session socket");
    if (!options.context_file.empty() || !options.context.empty() || options.context_is_json) {
      std::error_code ec;
      if (!options.context_file.empty()) {
        std::filesystem::copy_file(options.context_file, dir_ + "/context", ec);
        if (ec)
          throw Error("cannot read the context file '" + options.context_file +
                      "': " + ec.message());
      } else {
        std::ofstream(dir_ + "/context", std::ios::binary) << options.context;
      }
      chmod((dir_ + "/context").c_str(), 0644);
      has_context_ = true;
    }
  }
  ~Rendezvous() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  Mount mount() const {
    Mount mount;
    mount.type = Mount::Type::bind;
    mount.source = dir_;
    mount.target = kInside;
    mount.readonly = false;  // connect() needs write access to the socket
    return mount;
  }
  std::string socket_inside() const { return std::string(kInside) + "/channel.sock"; }
  std::string context_inside() const { return std::string(kInside) + "/context"; }
  bool has_context() const { return has_context_; }

  // Accepts until a connection's first frame is the hello with `token`; fills `channel`.
  std::optional<json> accept_hello(const std::string& token, int done_fd,
                                   Clock::time_point deadline, Channel& channel) {
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {done_fd, POLLIN, 0}};
      if (poll(fds, 2, static_cast<int>(left.count()) + 1) <= 0) continue;
      if (fds[1].revents) return std::nullopt;
      UniqueFd peer(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!peer) continue;
      Channel candidate(std::move(peer), max_frame_);
      std::optional<json> hello;
      try {
        hello = first_frame(candidate, deadline);
      } catch (const Error&) {
        continue;  // garbage from whoever connected: not our worker
      }
      if (hello && text_field(*hello, "type") == "hello" &&
          same_token(text_field(*hello, "token"), token)) {
        channel = std::move(candidate);
        listener_.reset();  // nobody else gets in
        return hello;
      }
    }
  }

 private:
  static std::optional<json> first_frame(Channel& channel, Clock::time_point deadline) {
    for (;;) {
      if (auto frame = channel.next_frame()) return frame;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      pollfd readable{channel.fd(), POLLIN, 0};
      if (left.count() <= 0 || poll(&readable, 1, static_cast<int>(left.count()) + 1) <= 0)
        return std::nullopt;
      if (!channel.receive()) return channel.next_frame();  // EOF: a last complete frame counts
    }
  }

  std::string dir_;
  UniqueFd listener_;
  std::uint64_t max_frame_;
  bool has_context_ = false;
};

class WorkerSession final : public Session {
 public:
  WorkerSession(Backend& backend, const Policy& policy, SessionOptions options)
      : backend_(backend),
        name_(backend.name()),
        policy_(policy),
        options_(std::move(options)),
        cell_limit_(policy.limits.wall_time),
        answers_(std::make_shared<AnswerQueue>()),
        run_(std::make_shared<RunState>()) {
    if (!answers_->event || !run_->done) throw system_error("eventfd");
    policy_.limits.wall_time = options_.lifetime;
    start();
  }

  ~WorkerSession() override {
    try {
      close();
    } catch (...) {
    }
  }

  std::string_view backend() const override { return name_; }
  std::string ended() const override { return ended_; }

  CellResult execute(const std::string& code, std::optional<milliseconds> timeout) override;

  // The checkpoint holds exactly the state the standby has: a snapshot is the checkpoint kept
  // (committed instead of discarded when the next cell succeeds).
  SnapshotId snapshot() override {
    require_alive();
    await_standby();
    if (checkpoint_snapshot_) return *checkpoint_snapshot_;
    const auto id = next_id_++;
    checkpoint_ = &snapshots_.emplace(id, std::move(own_checkpoint_)).first->second;
    checkpoint_snapshot_ = id;
    return id;
  }

  void restore(SnapshotId id) override {
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

  Result close() override {
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

 private:
  class Cell;

  void start() {
    const bool by_socket = !backend_.can_inherit_fds();
    UniqueFd host, sandbox, context;
    if (by_socket) {
      rendezvous_ = std::make_unique<Rendezvous>(options_);
      policy_.filesystem.mounts.push_back(rendezvous_->mount());
    } else {
      int pair[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        throw system_error("socketpair");
      host.reset(pair[0]);
      sandbox = raised(UniqueFd(pair[1]));
      context = context_fd(options_);
    }
    int stop_pipe[2];
    if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw system_error("pipe2");
    stop_read_.reset(stop_pipe[0]);
    stop_write_.reset(stop_pipe[1]);
    const std::string token = random_token();

    Request request;
    request.argv = {"python3", "-I", "-S", "-c", std::string(worker_source())};
    request.env = {{"RLM_SANDBOX_TOKEN", token},
                   {"RLM_SANDBOX_MAX_FRAME", std::to_string(options_.max_frame_bytes)},
                   {"RLM_SANDBOX_CONTEXT_FORMAT", options_.context_is_json ? "json" : "text"}};
    if (by_socket) {
      request.env["RLM_SANDBOX_SOCKET"] = rendezvous_->socket_inside();
      if (rendezvous_->has_context())
        request.env["RLM_SANDBOX_CONTEXT_FILE"] = rendezvous_->context_inside();
    } else {
      request.env["RLM_SANDBOX_FD"] = std::to_string(sandbox.get());
      request.inherit_fds = {sandbox.get()};
      if (context) {
        request.env["RLM_SANDBOX_CONTEXT_FD"] = std::to_string(context.get());
        request.inherit_fds.push_back(context.get());
      }
    }
    request.stop_fd = stop_read_.get();
    request.guard_signals = true;  // a cell must not signal its checkpoints (docs/sessions.md)
    // The sandbox outlives many cells, each held to the policy's limits on its own: its total CPU
    // time is bounded only by the session's lifetime on every CPU.
    request.sandbox_cpu_time =
        options_.lifetime * std::max(1u, std::thread::hardware_concurrency());
    request.on_stdout = [](std::string_view) {};  // outside a cell nothing is expected there
    request.on_stderr = [run = run_](std::string_view text) {
      std::lock_guard lock(run->mutex);
      auto& kept = run->worker_stderr;
      kept.append(text);
      if (kept.size() > kWorkerStderrKept) kept.erase(0, kept.size() - kWorkerStderrKept);
    };
    request.on_started = [run = run_](std::function<LiveCounters()> probe) {
      std::lock_guard lock(run->mutex);
      run->probe = std::move(probe);
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
        run->probe = nullptr;
      }
      const std::uint64_t one = 1;
      [[maybe_unused]] const ssize_t ignored = write(run->done.get(), &one, sizeof one);
    });

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
    // The sandbox has its copies (or is gone): ours would only hide its end of the channel.
    sandbox.reset();
    context.reset();
    if (!hello || text_field(*hello, "type") != "hello" ||
        !same_token(text_field(*hello, "token"), token)) {
      std::string why = ended_;
      if (why.empty())
        why = !hello ? "the worker did not say hello"
                     : "the worker's first frame was not a hello with the session token";
      abandon();
      throw Error("the session could not start: " + why + run_summary());
    }
    await_standby(0);
  }

  // What the run thread learned, for error messages: the Result's detail and the worker's stderr.
  std::string run_summary() {
    std::lock_guard lock(run_->mutex);
    std::string summary;
    if (run_->result && !run_->result->detail.empty())
      summary += "; the sandbox: " + run_->result->detail;
    if (!run_->failure.empty()) summary += "; " + run_->failure;
    if (!run_->worker_stderr.empty()) summary += "; the worker's stderr: " + run_->worker_stderr;
    return summary;
  }

  void stop_run() {
    const char stop = 1;
    [[maybe_unused]] const ssize_t ignored = write(stop_write_.get(), &stop, 1);
  }

  // Ends a session that can no longer be trusted or used: the sandbox is stopped at once.
  void close_channels() {
    standby_.close();
    own_checkpoint_.close();
    snapshots_.clear();
    checkpoint_ = &own_checkpoint_;
    checkpoint_snapshot_.reset();
  }

  void abandon() {
    closed_ = true;
    close_channels();
    stop_run();
    if (run_thread_.joinable()) run_thread_.join();
  }

  [[noreturn]] void fail(const std::string& why) {
    if (ended_.empty()) ended_ = why;
    abandon();
    throw Error("the session ended: " + why + run_summary());
  }

  void require_alive() const {
    if (!ended_.empty()) throw Error("the session has ended: " + ended_);
  }

  bool run_finished() {
    pollfd done{run_->done.get(), POLLIN, 0};
    return poll(&done, 1, 0) > 0;
  }

  static bool wait_readable(int fd, milliseconds timeout) {
    pollfd ready{fd, POLLIN, 0};
    int result;
    while ((result = poll(&ready, 1, static_cast<int>(timeout.count()))) < 0 && errno == EINTR) {
    }
    return result > 0;
  }

  void send_or_end(Channel& channel, const json& message) {
    if (!channel.send(message)) fail("the sandboxed interpreter is gone");
  }

  // The next frame on `channel`, waiting until `deadline`; nullopt at EOF, at the deadline, or
  // when the sandbox ended. Throws Error for a malformed frame.
  std::optional<json> next_frame_until(Channel& channel, Clock::time_point deadline) {
    for (;;) {
      if (auto frame = channel.next_frame()) return frame;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      const short events = POLLIN | (channel.unsent() ? POLLOUT : 0);
      pollfd fds[2] = {{channel.fd(), events, 0}, {run_->done.get(), POLLIN, 0}};
      if (poll(fds, 2, static_cast<int>(left.count()) + 1) < 0 && errno != EINTR)
        return std::nullopt;
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

  // Makes sure there is a standby: the checkpoint forks one after start-up, every cell, a rollback
  // and a restore, and announces it with a fork frame (for op `id` when given). A standby that
  // died while idle is replaced the same way (the checkpoint reports rolled_back first).
  void await_standby(std::optional<SnapshotId> id = std::nullopt) {
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
      auto frame = next_frame_or_fail(*checkpoint_, "fork");
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

  // The checkpoint is done with: a snapshot is kept (commit: it stops watching its child),
  // anything else ends.
  void release_checkpoint() {
    if (checkpoint_snapshot_) {
      checkpoint_->send({{"op", "commit"}});
    } else {
      own_checkpoint_.send({{"op", "discard"}});
      own_checkpoint_.close();
    }
  }

  json next_frame_or_fail(Channel& channel, std::string_view expected) {
    std::optional<json> frame;
    try {
      frame = next_frame_until(channel, Clock::now() + kAnswerBound);
    } catch (const Error& error) {
      fail(error.what());
    }
    if (!frame) fail("no " + std::string(expected) + " from the sandboxed interpreter");
    return std::move(*frame);
  }

  // What the sandbox's cgroup has counted so far (nothing without one).
  LiveCounters counters() {
    std::function<LiveCounters()> probe;
    {
      std::lock_guard lock(run_->mutex);
      probe = run_->probe;
    }
    return probe ? probe() : LiveCounters{};
  }

  Backend& backend_;
  std::unique_ptr<Rendezvous> rendezvous_;  // the socket directory of a backend without fd passing
  std::string name_;
  Policy policy_;
  SessionOptions options_;
  milliseconds cell_limit_;
  std::shared_ptr<AnswerQueue> answers_;
  std::shared_ptr<RunState> run_;
  std::thread run_thread_;
  UniqueFd stop_read_, stop_write_;
  // The frozen checkpoint: own_checkpoint_, or a snapshot's entry when it is one.
  Channel own_checkpoint_;
  Channel* checkpoint_ = &own_checkpoint_;
  std::optional<SnapshotId> checkpoint_snapshot_;
  Channel standby_;  // empty until the checkpoint's fork frame for it has been read
  std::map<SnapshotId, Channel> snapshots_;
  std::uint64_t next_id_ = 1;
  std::uint64_t generation_ = 0;
  std::uint64_t next_call_ = 1;
  std::string ended_;
  bool closed_ = false;
};

// One execute: the standby runs the cell; the checkpoint holds the state from before it. This
// drives both until the cell's result or a rollback. The sandbox is never waited on: writes are
// queued and flushed as the sockets take them, the standby is read only while the session's
// buffer has room, and the cell's deadline holds whatever the cell does with its channel.
class WorkerSession::Cell {
 public:
  Cell(WorkerSession& session, const std::string& code, milliseconds limit)
      : s_(session),
        code_(code),
        limit_(limit),
        id_(session.next_id_++),
        budget_(session.policy_.limits.session_buffer_bytes) {}

  CellResult run() {
    start_ = Clock::now();
    const auto counters = s_.counters();
    oom_before_ = counters.oom_kills;
    cpu_start_ = counters.cpu;
    s_.await_standby();
    generation_ = ++s_.generation_;
    s_.send_or_end(s_.standby_, {{"op", "execute"},
                                 {"id", id_},
                                 {"code", code_},
                                 {"output_cap", s_.policy_.limits.output_bytes}});
    try {
      while (!finished_) step();
    } catch (const Error& error) {
      // The sandbox broke the protocol (garbage, an oversize frame, a wrong reply): the session
      // cannot be trusted any more. The cell says why; later calls throw.
      s_.ended_ = error.what();
      s_.abandon();
      result_.status = CellStatus::session_error;
      result_.error = std::string("the session ended: ") + error.what();
    }
    cancelled_->store(true);
    result_.wall = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_);
    return std::move(result_);
  }

 private:
  // Per open call, charged to the session's buffer besides its prompt: what the host keeps for it.
  static constexpr std::uint64_t kCallOverhead = 1024;
  // A batch with more prompts ends the session (the worker refuses to send one).
  static constexpr std::size_t kMaxBatch = 10'000;

  // The cell's clock. Its limit runs in wall time, except while the host waits for LM answers
  // (a call open, the sandbox not held back by a full buffer, and a CPU counter to watch): the
  // time the poll loop then spends idle is not counted, and instead the sandbox's CPU time since
  // the cell started is held to the limit, read every kCpuCheck. The host's own work (reading,
  // answering) always counts. Without a CPU counter the wall clock never pauses.
  bool should_pause() const {
    return open_calls_ > 0 && cpu_start_ && !held_back_ && s_.standby_ && !rollback_sent_;
  }

  // When step() must act: the cell's limit, the next CPU check while paused, or (after a rollback
  // was asked for) the bound on the checkpoint's answer.
  Clock::time_point deadline() const {
    if (rollback_sent_) return *rollback_sent_ + kAnswerBound;
    if (pausing_) return next_cpu_check_;
    return start_ + limit_ + waited_;
  }

  bool cpu_exhausted() {
    const auto cpu = s_.counters().cpu;
    if (!cpu) {
      cpu_start_.reset();  // the counter is gone: the wall clock runs from now on
      return false;
    }
    return *cpu - *cpu_start_ >= limit_;
  }

  // Bytes the session holds for this sandbox: what came from it and is not handled yet, prompts at
  // the LM handler (an earlier cell's included), answers not yet sent, and replies not yet written.
  std::uint64_t in_flight() const {
    std::uint64_t total = s_.answers_->at_handler.load() + held_answers_ +
                          s_.checkpoint_->unread() + s_.checkpoint_->unsent();
    if (s_.standby_) total += s_.standby_.unread() + s_.standby_.unsent();
    return total;
  }

  // How much may be read from the standby now: what is left of the budget; a frame larger than
  // that still completes when it alone fills the buffer (the frame cap bounds it).
  std::size_t read_room() const {
    if (!s_.standby_) return 0;
    const std::uint64_t used = in_flight();
    if (used < budget_)
      return static_cast<std::size_t>(std::min<std::uint64_t>(budget_ - used, Channel::kReadSlice));
    if (used == s_.standby_.partial_bytes())
      return std::min(s_.standby_.partial_wants(), Channel::kReadSlice);
    return 0;
  }

  // The sandbox is held back when the buffer is full and it has more to send.
  bool sandbox_has_more() const {
    if (s_.standby_.partial_wants() > 0) return true;
    int queued = 0;
    return ioctl(s_.standby_.fd(), FIONREAD, &queued) == 0 && queued > 0;
  }

  void time_out(Clock::time_point now) {
    rollback_sent_ = now;
    timed_out_ = true;
    if (!s_.checkpoint_->send({{"op", "rollback"}, {"id", id_}, {"reason", "timeout"}}))
      throw Error("the checkpoint interpreter is gone");
  }

  void step() {
    auto now = Clock::now();
    const std::size_t room = read_room();
    held_back_ = room == 0 && s_.standby_ && sandbox_has_more();
    const bool pause = should_pause();
    if (pause && !pausing_) next_cpu_check_ = now + kCpuCheck;
    pausing_ = pause;
    if (now >= deadline()) {
      if (rollback_sent_) throw Error("the checkpoint interpreter did not answer the rollback");
      if (!pausing_ || cpu_exhausted()) {
        pausing_ = false;
        time_out(now);
        return;
      }
      next_cpu_check_ = now + kCpuCheck;
      pausing_ = should_pause();  // the CPU counter may have gone
    }
    const auto wait = std::chrono::duration_cast<milliseconds>(deadline() - now).count() + 1;
    const int timeout = static_cast<int>(std::clamp<std::int64_t>(wait, 0, 60'000));
    const short standby_events =
        s_.standby_
            ? static_cast<short>((room > 0 ? POLLIN : 0) | (s_.standby_.unsent() ? POLLOUT : 0))
            : 0;
    const short checkpoint_events =
        static_cast<short>(POLLIN | (s_.checkpoint_->unsent() ? POLLOUT : 0));
    pollfd fds[4] = {{s_.checkpoint_->fd(), checkpoint_events, 0},
                     {standby_events ? s_.standby_.fd() : -1, standby_events, 0},
                     {s_.answers_->event.get(), POLLIN, 0},
                     {s_.run_->done.get(), POLLIN, 0}};
    const int ready = poll(fds, 4, timeout);
    if (pausing_) waited_ += Clock::now() - now;  // idle, waiting for the LM
    if (ready < 0) return;                        // EINTR
    if (fds[2].revents) deliver_answers();
    if (fds[1].revents && s_.standby_) serve_standby(fds[1].revents, room);
    if (fds[0].revents) serve_checkpoint(fds[0].revents);
    if (!finished_ && fds[3].revents) {
      std::string detail;
      {
        std::lock_guard lock(s_.run_->mutex);
        if (s_.run_->result) detail = ": " + s_.run_->result->detail;
      }
      throw Error("the sandbox ended" + detail);
    }
  }

  void serve_checkpoint(short revents) {
    Channel& checkpoint = *s_.checkpoint_;
    bool open = true;
    if (revents & (POLLOUT | POLLHUP | POLLERR)) open = checkpoint.flush();
    if (revents & ~POLLOUT) open = checkpoint.receive() && open;
    while (!finished_) {
      auto frame = checkpoint.next_frame();
      if (!frame) break;
      const auto type = text_field(*frame, "type");
      if (type == "rolled_back" && rollback_sent_ && field(*frame, "id").is_null()) {
        // The standby died as our rollback crossed: the checkpoint reported that and forked a
        // new standby, which our rollback then kills. Its fork frame is superseded.
        superseded_fork_ = true;
      } else if (type == "rolled_back") {
        rolled_back(*frame);
      } else if (type == "fork" && superseded_fork_) {
        checkpoint.take_fd();  // closed unused
        superseded_fork_ = false;
      } else {
        throw Error("unexpected frame from the checkpoint interpreter: " + describe_frame(*frame));
      }
    }
    if (!open && !finished_) throw Error("the checkpoint interpreter is gone");
  }

  void serve_standby(short revents, std::size_t room) {
    Channel& standby = s_.standby_;
    bool open = true;
    if (revents & (POLLOUT | POLLHUP | POLLERR)) open = standby.flush();
    if (open && room > 0 && (revents & ~POLLOUT)) open = standby.receive(room);
    while (!finished_ && standby) {
      auto frame = standby.next_frame();
      if (!frame) break;
      const auto type = text_field(*frame, "type");
      if (type == "llm_query") {
        ask(*frame, false);
      } else if (type == "llm_query_batched") {
        ask(*frame, true);
      } else if (type == "cell_result") {
        succeeded(*frame);
      } else {
        throw Error("unexpected frame from the sandboxed interpreter: " + describe_frame(*frame));
      }
    }
    if (!open && standby && !finished_) {
      // It died (the checkpoint says how), or it closed its channel (then the cell's deadline
      // ends it): no answer can reach it any more.
      standby.close();
    }
  }

  void ask(json& frame, bool batched) {
    const json& query_id = field(frame, "id");
    if (!query_id.is_number_integer())
      throw Error(std::string(batched ? "llm_query_batched" : "llm_query") +
                  " without an integer id");
    const json& model = field(frame, "model");
    std::optional<std::string> model_name;
    if (model.is_string()) model_name = model.get<std::string>();
    std::vector<std::string> prompts;
    json& raw = frame[batched ? "prompts" : "prompt"];
    if (batched && raw.is_array()) {
      if (raw.size() > kMaxBatch)
        throw Error("llm_query_batched with " + std::to_string(raw.size()) +
                    " prompts, over the limit of " + std::to_string(kMaxBatch));
      prompts.reserve(raw.size());
      for (auto& prompt : raw) {
        if (!prompt.is_string()) throw Error("llm_query_batched with a prompt that is no string");
        prompts.push_back(std::move(prompt.get_ref<std::string&>()));
      }
    } else if (!batched && raw.is_string()) {
      prompts.push_back(std::move(raw.get_ref<std::string&>()));
    } else {
      throw Error(std::string("malformed ") + (batched ? "llm_query_batched" : "llm_query") +
                  " frame");
    }
    const auto call = s_.next_call_++;
    calls_[call] =
        OpenCall{query_id, batched, std::vector<std::optional<LlmAnswer>>(prompts.size()),
                 prompts.size(), 0};
    ++open_calls_;
    result_.llm_calls += static_cast<unsigned>(prompts.size());
    if (prompts.empty()) {
      finish_call(call);
      return;
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const std::uint64_t bytes =
          prompts[i].size() + (model_name ? model_name->size() : 0) + kCallOverhead;
      auto charge = std::make_shared<AnswerQueue::Charge>(s_.answers_, bytes);
      auto done = [queue = s_.answers_, charge, generation = generation_, call,
                   i](LlmAnswer answer) {
        charge->release();
        queue->push({generation, call, i, std::move(answer)});
      };
      if (!s_.options_.llm) {
        done(LlmAnswer::of_error("no LM handler is configured for this session"));
        continue;
      }
      try {
        s_.options_.llm->answer(LlmCall{std::move(prompts[i]), model_name, cancelled_}, done);
      } catch (const std::exception& error) {
        done(LlmAnswer::of_error(error.what()));
      }
    }
  }

  static std::uint64_t answer_bytes(const LlmAnswer& answer) {
    return (answer.text ? answer.text->size() : 0) + answer.error.size();
  }

  void deliver_answers() {
    for (auto& item : s_.answers_->take()) {
      if (item.generation != generation_) continue;  // for an interpreter rolled back since
      const auto call = calls_.find(item.call);
      if (call == calls_.end() || item.index >= call->second.items.size() ||
          call->second.items[item.index])
        continue;
      const auto bytes = answer_bytes(item.answer);
      held_answers_ += bytes;
      call->second.held += bytes;
      call->second.items[item.index] = std::move(item.answer);
      if (--call->second.missing == 0) finish_call(item.call);
    }
  }

  static json answer_json(LlmAnswer& answer) {
    return answer.text ? json{{"text", std::move(*answer.text)}}
                       : json{{"error", std::move(answer.error)}};
  }

  void finish_call(std::uint64_t number) {
    auto& call = calls_.at(number);
    json reply;
    if (call.batched) {
      json items = json::array();
      for (auto& item : call.items) items.push_back(answer_json(*item));
      reply = {{"op", "llm_results"}, {"id", call.query_id}, {"items", std::move(items)}};
    } else {
      reply = answer_json(*call.items.front());
      reply["op"] = "llm_result";
      reply["id"] = call.query_id;
    }
    held_answers_ -= call.held;
    calls_.erase(number);
    --open_calls_;
    if (s_.standby_) s_.standby_.send(reply);  // a failed send shows up as the standby's EOF
  }

  static std::string take_text(json& frame, const char* key) {
    const auto found = frame.find(key);
    if (found == frame.end() || !found->is_string()) return {};
    return std::move(found->get_ref<std::string&>());
  }

  void succeeded(json& frame) {
    if (field(frame, "id") != json(id_))
      throw Error("a cell_result for another cell: " + describe_frame(frame));
    if (rollback_sent_) return;  // too late: the checkpoint is already rolling it back
    finished_ = true;
    result_.status = text_field(frame, "status") == "ok" ? CellStatus::ok : CellStatus::error;
    result_.stdout_data = take_text(frame, "stdout");
    result_.stderr_data = take_text(frame, "stderr");
    result_.stdout_truncated = flag_field(frame, "stdout_truncated");
    result_.stderr_truncated = flag_field(frame, "stderr_truncated");
    result_.error = take_text(frame, "error");
    if (auto final = frame.find("final");
        final != frame.end() && final->is_object() && final->contains("value"))
      result_.final = std::move((*final)["value"]);
    // At most the cell's own wall time could be meant; a day bounds the conversion.
    constexpr double kDayMs = 86'400'000;
    result_.cpu = std::chrono::microseconds(
        static_cast<std::int64_t>(milliseconds_field(frame, "cpu_ms", kDayMs) * 1000));
    // The state before the cell is no longer needed (unless it is a snapshot): the standby that
    // ran the cell is the checkpoint from now on, and forks the next standby.
    s_.release_checkpoint();
    s_.own_checkpoint_ = std::move(s_.standby_);
    s_.standby_ = Channel();
    s_.checkpoint_ = &s_.own_checkpoint_;
    s_.checkpoint_snapshot_.reset();
  }

  void rolled_back(const json& frame) {
    // null: the checkpoint saw the standby die without being asked.
    if (const auto& id = field(frame, "id"); !id.is_null() && id != json(id_))
      throw Error("a rollback report for another cell: " + describe_frame(frame));
    finished_ = true;
    s_.standby_.close();  // the checkpoint forks the next standby
    result_.rolled_back = true;
    if (timed_out_) {
      result_.status = CellStatus::timeout;
      result_.error = "the cell ran past its time limit of " + format_duration(limit_) +
                      "; the session was rolled back to before it";
      return;
    }
    const auto oom_after = s_.counters().oom_kills;
    if (oom_before_ && oom_after && *oom_after > *oom_before_) {
      result_.status = CellStatus::memory_limit;
      result_.error = "the cell was killed at the memory limit of " +
                      format_size(s_.policy_.limits.memory_bytes) +
                      "; the session was rolled back to before it";
      return;
    }
    result_.status = CellStatus::crashed;
    result_.error = describe_exit(frame) + "; the session was rolled back to before the cell";
  }

  struct OpenCall {
    json query_id;
    bool batched;
    std::vector<std::optional<LlmAnswer>> items;
    std::size_t missing;
    std::uint64_t held;  // answer bytes received so far
  };

  WorkerSession& s_;
  const std::string& code_;
  milliseconds limit_;
  SnapshotId id_;
  std::uint64_t budget_;
  Clock::time_point start_;
  std::optional<std::uint64_t> oom_before_;
  std::optional<std::chrono::microseconds> cpu_start_;
  std::uint64_t generation_ = 0;
  std::map<std::uint64_t, OpenCall> calls_;
  std::size_t open_calls_ = 0;
  std::uint64_t held_answers_ = 0;
  bool held_back_ = false;
  bool pausing_ = false;  // this step's poll waits for the LM
  Clock::time_point next_cpu_check_;
  Clock::duration waited_{0};
  std::optional<Clock::time_point> rollback_sent_;
  bool timed_out_ = false;
  bool superseded_fork_ = false;
  bool finished_ = false;
  CellResult result_;
  // Calls this cell made that are still queued in a handler are dropped once it has ended.
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

CellResult WorkerSession::execute(const std::string& code, std::optional<milliseconds> timeout) {
  require_alive();
  if (timeout && *timeout > cell_limit_)
    throw Error("a cell timeout of " + format_duration(*timeout) +
                " is above the policy's limits.wall_time_ms of " + format_duration(cell_limit_));
  return Cell(*this, code, timeout.value_or(cell_limit_)).run();
}

}  // namespace

std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             SessionOptions options) {
  return std::make_unique<WorkerSession>(backend, policy, std::move(options));
}

}  // namespace rlm::session
