// One execute (or add_context, which is handled as a cell): the standby runs the cell; the
// checkpoint holds the state from before it. A Cell drives both until the cell's result or a
// rollback, and answers the cell's llm_query calls meanwhile (broker/routing.hpp). The sandbox is
// never waited on: writes are queued and flushed as the sockets take them, the standby is read only
// while the session's buffer has room, and the cell's deadline holds whatever the cell does with
// its channel.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "broker/routing.hpp"
#include "rlm_sandbox/session.hpp"
#include "session/worker_session.hpp"

namespace rlm::session {

class Cell {
 public:
  // `op` is the execute or add_context frame without its id (the cell gives it one); `fd`, when
  // not -1, is attached to its first byte (add_context's input) and must stay open until run()
  // returns.
  Cell(WorkerSession& session, nlohmann::json op, std::chrono::milliseconds limit, int fd = -1);

  // The cell's result; a session that broke the protocol is ended, and the result says why.
  CellResult run();

 private:
  using Clock = std::chrono::steady_clock;

  bool should_pause() const;
  Clock::time_point deadline() const;
  bool cpu_exhausted();
  std::uint64_t in_flight() const;
  std::size_t read_room() const;
  bool sandbox_has_more() const;
  void time_out(Clock::time_point now);
  void step();
  void serve_checkpoint(short revents);
  void serve_standby(short revents, std::size_t room);
  void ask(nlohmann::json& frame, bool batched);
  void answer();
  void succeeded(nlohmann::json& frame);
  void rolled_back(const nlohmann::json& frame);

  WorkerSession& s_;
  nlohmann::json op_;
  int fd_;
  std::chrono::milliseconds limit_;
  SnapshotId id_;
  std::uint64_t budget_;
  Clock::time_point start_;
  std::optional<std::uint64_t> oom_before_;
  std::optional<std::chrono::microseconds> cpu_start_;
  std::optional<NetworkAccount> network_before_;  // an allowlist's account as the cell began
  broker::CellCalls calls_;
  bool held_back_ = false;
  bool pausing_ = false;  // this step's poll waits for the LM
  Clock::time_point next_cpu_check_;
  Clock::duration waited_{0};
  std::optional<Clock::time_point> rollback_sent_;
  bool timed_out_ = false;
  bool superseded_fork_ = false;
  bool finished_ = false;
  CellResult result_;
};

}  // namespace rlm::session
