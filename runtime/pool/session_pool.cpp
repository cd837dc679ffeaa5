// Stand-in: every session is opened cold until warm sessions land.
#include "pool/session_pool.hpp"

#include <atomic>

namespace rlm::pool {

struct SessionPool::State {
  Backend* backend;
  const Policy* policy;
  std::atomic<std::uint64_t> cold{0};
};

SessionPool::SessionPool(Backend& backend, const Policy& policy, std::size_t)
    : state_(std::make_unique<State>()) {
  state_->backend = &backend;
  state_->policy = &policy;
}

SessionPool::~SessionPool() = default;

std::unique_ptr<Session> SessionPool::open(SessionOptions options) {
  ++state_->cold;
  return state_->backend->open_session(*state_->policy, std::move(options));
}

std::uint64_t SessionPool::warm_opened() const {
  return 0;
}
std::uint64_t SessionPool::cold_opened() const {
  return state_->cold;
}
std::size_t SessionPool::ready() const {
  return 0;
}

}  // namespace rlm::pool
