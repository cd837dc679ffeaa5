// The session every backend gets: the Python REPL worker (worker/python/, embedded)
// runs as the payload of Backend::run() on a thread of its own, and this object drives it over the
// control channel (docs/control-channel.md): one channel per interpreter process; a frozen
// checkpoint and an idle standby forked from it between cells; the standby runs the next cell at
// once (session/cell.hpp), and a cell that fails hard is rolled back to the checkpoint. A backend
// whose payload can inherit an fd (namespace, local) gets the channel as one; the others (docker)
// through a socket in a bind-mounted directory (session/rendezvous.hpp).
//
// A session is opened in two phases: the start (the sandbox, the worker's imports, its hello, the
// first checkpoint and its standby warmed up; nothing of any caller) and the hand-over (the
// caller's context, LM handler, lifetime and frame limit). A cold open does both at once; a warm
// pool (pool/session_pool.hpp) starts sessions ahead and hands each over to one caller.
#pragma once

#include <sys/eventfd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/session.hpp"
#include "session/channel.hpp"
#include "session/save_file.hpp"

namespace rlm::broker {
class AnswerQueue;
}

namespace rlm::session {

class Cell;
class Rendezvous;

// What a caller brings to a started session: its options, and its context opened (a memfd
// holding `context`, or `context_file` opened read-only), which crosses as an fd on the hand-over
// frame, whatever its size.
struct Handover {
  SessionOptions options;
  host::UniqueFd context;
};
// Throws Error for a context file that cannot be opened or tools that validate_tools() refuses,
// before any sandbox is touched.
Handover prepare_handover(SessionOptions options);

// Start and hand-over in one (the cold path). Throws Error when the worker does not come up
// (python3 missing in the sandbox, the policy forbids what it needs, an invalid JSON context...).
std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             SessionOptions options);
std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             Handover handover);

// The end of the run thread, seen by the poll loops through an eventfd.
struct RunState {
  std::mutex mutex;
  std::optional<Result> result;
  std::string failure;  // run() threw
  std::string worker_stderr;
  RunningSandbox running;  // null members before the start and after the run
  host::UniqueFd done{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
};

class WorkerSession final : public Session {
 public:
  // How long a frozen interpreter has to answer (a fork frame, a rollback).
  static constexpr std::chrono::milliseconds kAnswerBound{10'000};

  // The start: runs the worker as a payload of backend.run() and waits for its hello. `start`
  // gives the start_timeout, the frame limit until the hand-over, and the lifetime of the run
  // (the sandbox's wall time: no caller's lifetime can reach past it). Throws Error.
  WorkerSession(Backend& backend, const Policy& policy, const SessionOptions& start);
  ~WorkerSession() override;

  // Gives the started session to its caller: the context and the REPL options (echo, tools)
  // cross (the standby takes them at once, the checkpoint when it forks again), and from now on
  // the caller's LM handler answers (through limit_llm_handler with its llm_limits), its frame
  // limit holds and its lifetime runs. Once only. Throws Error (the session is ended then).
  void hand_over(Handover handover);
  // Started, not handed over, and still waiting as started: its sandbox runs and its worker has
  // sent nothing since hello (a warm session that died is never handed over).
  bool waiting() const;
  // When the run's wall time ends the sandbox: a caller's lifetime must end before it.
  std::chrono::steady_clock::time_point run_ends() const { return run_ends_; }

  std::string_view backend() const override { return name_; }
  std::string ended() const override { return ended_; }
  using Session::execute;
  CellResult execute(const std::string& code, const ExecuteOptions& options) override;
  CellResult add_context(ContextKind kind, const ContextInput& input,
                         std::optional<std::size_t> index) override;
  // The checkpoint holds exactly the state the standby has: a snapshot is the checkpoint kept
  // (committed instead of discarded when the next cell succeeds).
  SnapshotId snapshot() override;
  void restore(SnapshotId id) override;
  CellResult save_to_fd(int fd) override;
  CellResult load_from_fd(int fd) override;
  // A save's state sealed in a memfd, without a save file's framing (fork_session's own): the
  // result, and when it is ok the memfd and its size.
  struct SealedState {
    CellResult result;
    host::UniqueFd fd;
    std::uint64_t size = 0;
  };
  SealedState save_state();
  const SaveIdentity& identity() const { return save_identity_; }
  // The most bytes of state this session may save or load: its memory limit, at most 4 GiB.
  std::uint64_t state_room() const;
  // The state `offset` bytes into `fd`, a sealed memfd the caller made and trusts (a fork's own
  // save): load_from_fd's checks are skipped, the sandbox still reads it as hostile.
  CellResult load_state(int fd, std::uint64_t offset);
  void narrow_network(const std::vector<std::string>& entries) override;
  Result close() override;
  void kill(const std::string& why) override;

 private:
  friend class Cell;
  using Clock = std::chrono::steady_clock;

  void start();
  void start_run(Request request);
  // Stops the run at `after` from now (0: at once; never re-armed after that).
  void arm_stop(std::chrono::nanoseconds after);
  // What the run thread learned, for error messages: the Result's detail and the worker's stderr.
  std::string run_summary();
  // Why the run ended, for a cell's error: the Result's detail, or the lifetime running out.
  std::string run_end_detail();
  // Why the session ended, given what a call saw break: the kill's words once it was killed (what
  // it saw then is only the symptom).
  std::string end_reason(const std::string& seen) const;
  // The lifetime timer (armed at the hand-over) has fired.
  bool lifetime_ran_out() const;
  void stop_run();
  // Ends a session that can no longer be trusted or used: the sandbox is stopped at once.
  void close_channels();
  void abandon();
  [[noreturn]] void fail(const std::string& why);
  void require_alive() const;
  void send_or_end(Channel& channel, const nlohmann::json& message);
  // The next frame on `channel`, waiting until `deadline`; nullopt at EOF, at the deadline, or
  // when the sandbox ended. Throws Error for a malformed frame.
  std::optional<nlohmann::json> next_frame_until(Channel& channel, Clock::time_point deadline);
  nlohmann::json next_frame_or_fail(Channel& channel, std::string_view expected,
                                    std::chrono::milliseconds bound = kAnswerBound);
  // Makes sure there is a standby: the checkpoint forks one after start-up, every cell, a rollback
  // and a restore, and announces it with a fork frame (for op `id` when given). A standby that
  // died while idle is replaced the same way (the checkpoint reports rolled_back first).
  void await_standby(std::optional<SnapshotId> id = std::nullopt,
                     std::chrono::milliseconds bound = kAnswerBound);
  // The checkpoint is done with: a snapshot is kept (commit: it stops watching its child),
  // anything else ends.
  void release_checkpoint();
  // What the sandbox's cgroup has counted so far (nothing without one).
  LiveCounters counters();

  Backend& backend_;
  std::unique_ptr<Rendezvous> rendezvous_;  // the socket directory of a backend without fd passing
  std::string name_;
  Policy policy_;  // as the sandbox runs it: wall_time is the session's lifetime
  // What a save file of this session must match: the policy as the caller gave it (not its
  // lifetime, a warm pool's or a caller's, nor a later narrowing).
  SaveIdentity save_identity_;
  SessionOptions options_;
  std::chrono::milliseconds cell_limit_;
  std::shared_ptr<broker::AnswerQueue> answers_;
  std::shared_ptr<RunState> run_;
  std::thread run_thread_;
  // The run's stop_fd: a timerfd, armed with the lifetime at the hand-over, fired by stop_run().
  host::UniqueFd stop_timer_;
  bool stopping_ = false;  // stop_run() was called
  // kill(): why, once; read by the session's thread, written by any.
  mutable std::mutex kill_mutex_;
  std::string killed_;
  bool lifetime_armed_ = false;
  bool lifetime_over_ = false;  // the lifetime had run out when stop_run() was called
  std::chrono::steady_clock::time_point run_ends_;
  bool handed_over_ = false;
  // The frozen checkpoint: own_checkpoint_, or a snapshot's entry when it is one.
  Channel own_checkpoint_;
  Channel* checkpoint_ = &own_checkpoint_;
  std::optional<SnapshotId> checkpoint_snapshot_;
  Channel standby_;  // empty until the checkpoint's fork frame for it has been read
  std::map<SnapshotId, Channel> snapshots_;
  std::uint64_t next_id_ = 1;
  std::string ended_;
  bool closed_ = false;
};

}  // namespace rlm::session
