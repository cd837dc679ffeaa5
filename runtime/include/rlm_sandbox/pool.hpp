// Warm pools: sandboxes built before anyone asks for one. A Pool keeps pre-built sandboxes of one
// policy -- namespaces, root filesystem, cgroup and seccomp filter in place, rlm-sandbox-init
// waiting for its payload -- and pre-started REPL sessions (the Python worker's imports done and
// its first checkpoint taken, waiting for its context). run() and open_session() hand one over;
// a session, and by default a sandbox, is used once and destroyed; with PoolOptions::recycle a
// sandbox is made fresh between runs of one owner. Either way nothing of one run is visible to
// the next. A background thread refills; a drained pool runs on the cold path and never waits
// longer than a cold start.
// docs/pools-and-server.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {

struct PoolOptions {
  std::size_t sandboxes = 2;  // warm run sandboxes kept ready
  std::size_t sessions = 0;   // warm REPL sessions kept ready
  // Recycled sandboxes (docs/pools-and-server.md#recycled-sandboxes): how many runs one warm
  // sandbox serves before it is destroyed; between two, it is made fresh -- new PID, IPC, UTS and
  // mount namespaces and init, fresh /proc, /dev/shm and writable tmpfs, its cgroup's counters
  // restarted -- and shown clean (no socket left in its network namespace), else destroyed. It
  // serves one identity only (Request::bind_owner, else the caller's). 0 or 1: never recycled.
  // Where the policy or host does not allow it (recycle_problem) sandboxes are used once.
  std::size_t recycle = 0;
};

struct PoolStats {
  std::uint64_t warm_runs = 0, cold_runs = 0;           // runs served each way so far
  std::uint64_t recycled = 0;                           // sandboxes made fresh for another run
  std::uint64_t warm_sessions = 0, cold_sessions = 0;   // sessions opened each way so far
  std::size_t ready_sandboxes = 0, ready_sessions = 0;  // waiting in the pool now
};

class Pool {
 public:
  // Selects the policy's backend (as select_backend does: fails closed, throws BackendUnavailable
  // or Error) and starts filling in the background. Warm sandboxes are built by a backend that
  // builds ahead (Backend::builds_ahead: the namespace backend); on any other, every run takes
  // the cold path (stats() shows it).
  Pool(Policy policy, PoolOptions options);
  ~Pool();  // destroys every warm sandbox and session, and waits for the refill thread
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const Policy& policy() const;

  // As Backend::run with the pool's policy. Thread-safe: any number of threads may call it.
  Result run(const Request& request);
  // With `policy` instead: a warm sandbox serves it when it differs from the pool's policy only
  // in tighter limits (written to the sandbox's cgroup and rlimits before the payload starts);
  // any other difference takes the cold path. The caller has checked `policy` may be used
  // (tightening.hpp).
  Result run(const Request& request, const Policy& policy);

  // As Backend::open_session with the pool's policy; a warm session is handed over with
  // `options` (its context, its LM handler). Thread-safe.
  std::unique_ptr<Session> open_session(SessionOptions options);
  // With `policy` instead, always cold, but on the pool's backend: a policy's backend preference
  // never moves it elsewhere (a server's client must not choose a backend that isolates less).
  // The caller has checked `policy` may be used (tightening.hpp).
  std::unique_ptr<Session> open_session(const Policy& policy, SessionOptions options);

  PoolStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlm
