// A stand-in Pool that serves everything on the cold path; the warm pool replaces it.
#include "rlm_sandbox/pool.hpp"

#include <atomic>

#include "pool/session_pool.hpp"
#include "rlm_sandbox/backend.hpp"

namespace rlm {

struct Pool::State {
  Policy policy;
  PoolOptions options;
  std::unique_ptr<Backend> backend;
  std::atomic<std::uint64_t> cold_runs{0};
  std::unique_ptr<pool::SessionPool> sessions;
};

Pool::Pool(Policy policy, PoolOptions options) : state_(std::make_unique<State>()) {
  state_->backend = select_backend(policy);
  state_->policy = std::move(policy);
  state_->options = options;
  state_->sessions =
      std::make_unique<pool::SessionPool>(*state_->backend, state_->policy, options.sessions);
}

Pool::~Pool() {
  if (state_) state_->sessions.reset();  // before the backend they run on
}

const Policy& Pool::policy() const {
  return state_->policy;
}

Result Pool::run(const Request& request) {
  return run(request, state_->policy);
}

Result Pool::run(const Request& request, const Policy& policy) {
  ++state_->cold_runs;
  return state_->backend->run(request, policy);
}

std::unique_ptr<Session> Pool::open_session(SessionOptions options) {
  return state_->sessions->open(std::move(options));
}

PoolStats Pool::stats() const {
  PoolStats stats;
  stats.cold_runs = state_->cold_runs;
  stats.warm_sessions = state_->sessions->warm_opened();
  stats.cold_sessions = state_->sessions->cold_opened();
  stats.ready_sessions = state_->sessions->ready();
  return stats;
}

}  // namespace rlm
