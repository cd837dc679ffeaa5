// A stand-in Pool that serves everything on the cold path; the warm pool replaces it.
#include "rlm_sandbox/pool.hpp"

#include <atomic>

#include "rlm_sandbox/backend.hpp"

namespace rlm {

struct Pool::State {
  Policy policy;
  PoolOptions options;
  std::unique_ptr<Backend> backend;
  std::atomic<std::uint64_t> cold_runs{0}, cold_sessions{0};
};

Pool::Pool(Policy policy, PoolOptions options) : state_(std::make_unique<State>()) {
  state_->backend = select_backend(policy);
  state_->policy = std::move(policy);
  state_->options = options;
}

Pool::~Pool() = default;

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
  ++state_->cold_sessions;
  return state_->backend->open_session(state_->policy, std::move(options));
}

PoolStats Pool::stats() const {
  PoolStats stats;
  stats.cold_runs = state_->cold_runs;
  stats.cold_sessions = state_->cold_sessions;
  return stats;
}

}  // namespace rlm
