// Warm sessions: started ahead by a refill thread, handed over once, never reused.
#include "pool/session_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "session/worker_session.hpp"

namespace rlm::pool {
namespace {

using Clock = std::chrono::steady_clock;
using session::WorkerSession;
using namespace std::chrono_literals;

// How often the refill thread looks at the waiting sessions: one whose sandbox ended is replaced.
constexpr auto kCheckEvery = 500ms;
// After a start failed, the wait before the next try, doubling up to the maximum: a policy that
// cannot start a session (no python3 in its root) must not keep the refill thread starting
// sandboxes back to back.
constexpr auto kFirstBackoff = 1s;
constexpr auto kMaxBackoff = 60s;
// After a hand-over, the refill waits this long before it starts a sandbox: building one is
// heavy on the CPU (mounts, the interpreter's start), and the caller's first cell would compete
// with it, on a small machine for most of its time.
constexpr auto kRefillPause = 20ms;

// A warm session's run lasts twice a session's default lifetime: a caller asking for the default
// is served warm by a session that has waited less than one lifetime, and an older one is
// replaced. A caller asking for more than a waiting session's run has left is served cold.
SessionOptions start_options() {
  SessionOptions options;
  options.lifetime = 2 * SessionOptions().lifetime;
  return options;
}

}  // namespace

struct SessionPool::State {
  Backend* backend = nullptr;
  const Policy* policy = nullptr;
  std::size_t size = 0;
  SessionOptions start = start_options();
  std::chrono::milliseconds max_wait = SessionOptions().lifetime;

  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::unique_ptr<WorkerSession>> ready;
  // Taken out of `ready` (dead, too old): closed by the refill thread, outside the lock.
  std::vector<std::unique_ptr<WorkerSession>> discarded;
  bool stopping = false;
  Clock::time_point last_taken{};
  std::thread refill;

  std::atomic<std::uint64_t> warm{0}, cold{0};

  void refill_loop();
  // Moves the sessions that cannot be handed over any more to `discarded`.
  void sort_out(Clock::time_point now);
};

void SessionPool::State::sort_out(Clock::time_point now) {
  for (auto it = ready.begin(); it != ready.end();) {
    if ((*it)->waiting() && (*it)->run_ends() - now >= max_wait) {
      ++it;
    } else {
      discarded.push_back(std::move(*it));
      it = ready.erase(it);
    }
  }
}

void SessionPool::State::refill_loop() {
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  Clock::time_point next_try{};
  std::unique_lock lock(mutex);
  while (!stopping) {
    sort_out(Clock::now());
    if (!discarded.empty()) {
      auto closing = std::move(discarded);
      discarded.clear();
      lock.unlock();
      closing.clear();  // each close waits for its sandbox to end
      lock.lock();
      continue;
    }
    const auto start_at = std::max(next_try, last_taken + kRefillPause);
    if (ready.size() < size && Clock::now() >= start_at) {
      lock.unlock();
      std::unique_ptr<WorkerSession> started;
      try {
        started = std::make_unique<WorkerSession>(*backend, *policy, start);
        backoff = kFirstBackoff;
      } catch (const std::exception&) {
        // The same error reaches the next caller from the cold path, with its reason.
        next_try = Clock::now() + backoff;
        backoff = std::min<Clock::duration>(2 * backoff, kMaxBackoff);
      }
      lock.lock();
      if (started) ready.push_back(std::move(started));  // closed below when stopping
      continue;
    }
    auto until = Clock::now() + kCheckEvery;
    if (ready.size() < size) until = std::min(until, start_at);
    wake.wait_until(lock, until);
  }
}

SessionPool::SessionPool(Backend& backend, const Policy& policy, std::size_t size)
    : state_(std::make_unique<State>()) {
  state_->backend = &backend;
  state_->policy = &policy;
  state_->size = size;
  if (size > 0) state_->refill = std::thread([state = state_.get()] { state->refill_loop(); });
}

SessionPool::~SessionPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->refill.joinable()) state_->refill.join();
  // Closed all at once: each close ends its sandbox and waits for it.
  std::vector<std::unique_ptr<WorkerSession>> left;
  for (auto& session : state_->ready) left.push_back(std::move(session));
  for (auto& session : state_->discarded) left.push_back(std::move(session));
  std::vector<std::thread> closing;
  for (auto& session : left) closing.emplace_back([&session] { session.reset(); });
  for (auto& thread : closing) thread.join();
}

std::unique_ptr<Session> SessionPool::open(SessionOptions options) {
  // The caller's own errors (an unreadable context file) come before any session is taken.
  auto handover = session::prepare_handover(std::move(options));
  std::unique_ptr<WorkerSession> warm;
  // Warm sessions write through read-write binds as caller_ids(): another owner starts cold.
  const auto& owner = handover.options.bind_owner;
  const bool owner_fits = !owner || *owner == caller_ids() ||
                          std::none_of(state_->policy->filesystem.mounts.begin(),
                                       state_->policy->filesystem.mounts.end(), [](const Mount& m) {
                                         return m.type == Mount::Type::bind && !m.readonly;
                                       });
  if (owner_fits) {
    std::lock_guard lock(state_->mutex);
    const auto now = Clock::now();
    for (auto it = state_->ready.begin(); it != state_->ready.end();) {
      if (!(*it)->waiting()) {  // its sandbox ended while it waited
        state_->discarded.push_back(std::move(*it));
        it = state_->ready.erase(it);
      } else if (now + handover.options.lifetime > (*it)->run_ends()) {
        ++it;  // its run ends before this caller's lifetime would: left for another
      } else {
        warm = std::move(*it);
        state_->ready.erase(it);
        state_->last_taken = now;
        break;
      }
    }
  }
  state_->wake.notify_all();  // a refill, and the closing of what was discarded
  if (warm) {
    ++state_->warm;
    warm->hand_over(std::move(handover));
    return warm;
  }
  ++state_->cold;
  return session::open_worker_session(*state_->backend, *state_->policy, std::move(handover));
}

std::uint64_t SessionPool::warm_opened() const {
  return state_->warm;
}

std::uint64_t SessionPool::cold_opened() const {
  return state_->cold;
}

std::size_t SessionPool::ready() const {
  std::lock_guard lock(state_->mutex);
  return state_->ready.size();
}

}  // namespace rlm::pool
