// The session every backend gets: the Python REPL worker (worker/python/, embedded)
// runs as the payload of Backend::run() on a thread of its own, and this object drives it over the
// control channel (docs/control-channel.md): one channel per interpreter process; a frozen
// checkpoint and an idle standby forked from it between cells; the standby runs the next cell at
// once (session/cell.hpp), and a cell that fails hard is rolled back to the checkpoint. A backend
// whose payload can inherit an fd (namespace, local) gets the channel as one; the others (docker)
// through a socket in a bind-mounted directory (session/rendezvous.hpp).
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

#include "common/unique_fd.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/session.hpp"
#include "session/channel.hpp"

namespace rlm::broker {
class AnswerQueue;
}

namespace rlm::session {

class Cell;
class Rendezvous;

// Starts the Python worker as a payload of backend.run() and waits for its hello. Throws Error
// when it does not come (python3 missing in the sandbox, the policy forbids what it needs, ...).
std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             SessionOptions options);

// The end of the run thread, seen by the poll loops through an eventfd.
struct RunState {
  std::mutex mutex;
  std::optional<Result> result;
  std::string failure;  // run() threw
  std::string worker_stderr;
  std::function<LiveCounters()> probe;
  common::UniqueFd done{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
};

class WorkerSession final : public Session {
 public:
  // How long a frozen interpreter has to answer (a fork frame, a rollback).
  static constexpr std::chrono::milliseconds kAnswerBound{10'000};

  WorkerSession(Backend& backend, const Policy& policy, SessionOptions options);
  ~WorkerSession() override;

  std::string_view backend() const override { return name_; }
  std::string ended() const override { return ended_; }
  CellResult execute(const std::string& code,
                     std::optional<std::chrono::milliseconds> timeout) override;
  // The checkpoint holds exactly the state the standby has: a snapshot is the checkpoint kept
  // (committed instead of discarded when the next cell succeeds).
  SnapshotId snapshot() override;
  void restore(SnapshotId id) override;
  Result close() override;

 private:
  friend class Cell;
  using Clock = std::chrono::steady_clock;

  void start();
  void start_run(Request request);
  // What the run thread learned, for error messages: the Result's detail and the worker's stderr.
  std::string run_summary();
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
  nlohmann::json next_frame_or_fail(Channel& channel, std::string_view expected);
  // Makes sure there is a standby: the checkpoint forks one after start-up, every cell, a rollback
  // and a restore, and announces it with a fork frame (for op `id` when given). A standby that
  // died while idle is replaced the same way (the checkpoint reports rolled_back first).
  void await_standby(std::optional<SnapshotId> id = std::nullopt);
  // The checkpoint is done with: a snapshot is kept (commit: it stops watching its child),
  // anything else ends.
  void release_checkpoint();
  // What the sandbox's cgroup has counted so far (nothing without one).
  LiveCounters counters();

  Backend& backend_;
  std::unique_ptr<Rendezvous> rendezvous_;  // the socket directory of a backend without fd passing
  std::string name_;
  Policy policy_;
  SessionOptions options_;
  std::chrono::milliseconds cell_limit_;
  std::shared_ptr<broker::AnswerQueue> answers_;
  std::shared_ptr<RunState> run_;
  std::thread run_thread_;
  common::UniqueFd stop_read_, stop_write_;
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
