// The warm sessions of a Pool: REPL sessions started ahead (the worker's imports done, its first
// checkpoint taken), each waiting for the context and LM handler of the caller it is handed to.
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
  // Keeps `size` sessions of `policy` ready on `backend` (which outlives this object).
  SessionPool(Backend& backend, const Policy& policy, std::size_t size);
  ~SessionPool();  // closes every waiting session
  SessionPool(const SessionPool&) = delete;
  SessionPool& operator=(const SessionPool&) = delete;

  // A warm session handed over with `options`, or a cold one when none is ready.
  std::unique_ptr<Session> open(SessionOptions options);

  std::uint64_t warm_opened() const;
  std::uint64_t cold_opened() const;
  std::size_t ready() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlm::pool
