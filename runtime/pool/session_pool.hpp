// The warm sessions of a Pool: REPL sessions started ahead (the sandbox up, the worker's imports
// done, its hello said), each waiting for the context and LM handler of the one caller it is
// handed to, and destroyed after that caller. docs/pools-and-server.md, "Warm sessions".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::pool {

class SessionPool {
 public:
  // Keeps `size` sessions of `policy` ready on `backend` (both outlive this object), started by a
  // refill thread of its own.
  SessionPool(Backend& backend, const Policy& policy, std::size_t size);
  ~SessionPool();  // stops the refill thread and closes every waiting session
  SessionPool(const SessionPool&) = delete;
  SessionPool& operator=(const SessionPool&) = delete;

  // A warm session handed over with `options`, or a cold one when none is ready (never waits for
  // a refill). A waiting session whose sandbox ended, or whose run would end before `options`'
  // lifetime, is never handed over. Thread-safe. Throws Error as Backend::open_session does.
  std::unique_ptr<Session> open(SessionOptions options);

  std::uint64_t warm_opened() const;
  std::uint64_t cold_opened() const;
  std::size_t ready() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlm::pool
