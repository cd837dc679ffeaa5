// The warm pool: a queue of sandboxes of the pool's policy, built by a refill thread before anyone
// asks (Backend::build_ahead, on a backend that builds ahead), each used for one run and destroyed.
// A run that finds the queue empty, or a policy a warm sandbox cannot serve, goes cold on the
// backend at once: it never waits for the refill. docs/pools-and-server.md.
#include "rlm_sandbox/pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "policy/tightening.hpp"
#include "pool/session_pool.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm {
namespace {

using Clock = std::chrono::steady_clock;
using policy::limit_loosenings;  // the server's check of a client's limits, the same rules

// After a failed build the refill thread waits this long, doubling up to the maximum, so a host
// that cannot build sandboxes is not hammered; runs go cold meanwhile (and say why).
constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{2000};

// While runs keep arriving the refill holds back (building a sandbox takes the CPU a run's
// payload needs), until the pool is down to a quarter of its size or no run has been taken for
// this long: a burst is served from what was built before it, and the refill catches up after.
constexpr std::chrono::milliseconds kRefillQuiet{15};

// Making a sandbox fresh mostly waits on the kernel (the last run's PID namespace ending, grace
// periods after the detached mounts, the next init's exec), so several go at once: two clients
// back to back on 2 CPUs got 449-580 recycled runs/s with 2 recyclers, 698 with 8 (CPU-bound
// there).
constexpr std::size_t kRecyclers = 8;

// What a warm sandbox was built from, besides the limits: the policy's JSON without them (and
// without its name and description, which build nothing).
nlohmann::json shape_of(const Policy& policy) {
  auto json = policy.to_json();
  for (const char* key : {"limits", "name", "description"}) json.erase(key);
  return json;
}

}  // namespace

struct Pool::State {
  Policy policy;
  PoolOptions options;
  std::unique_ptr<Backend> backend;
  bool warm = false;  // the backend builds sandboxes ahead and the pool keeps some
  nlohmann::json shape;

  mutable std::mutex mutex;
  std::condition_variable wake;          // the refill thread: room in the queue, used ones, stop
  std::condition_variable recycle_wake;  // the recyclers: a sandbox to make fresh, stop
  // A warm sandbox, and with recycling (PoolOptions::recycle) how many runs it has served and for
  // whom: a recycled sandbox serves the identity of its first run only.
  struct Warm {
    std::unique_ptr<PreparedSandbox> sandbox;
    std::size_t runs = 0;
    std::optional<HostIds> owner;
  };
  std::deque<Warm> ready;
  std::vector<std::unique_ptr<PreparedSandbox>> used;  // destroyed by the refill thread
  std::deque<Warm> to_recycle;                         // made fresh by the recyclers
  std::size_t returning = 0;  // taken and expected back (recycling): counted as ready for refill
  bool stopping = false;
  Clock::time_point last_take{};  // when a run last took a sandbox
  std::thread refill;
  // With recycling: threads that make used sandboxes fresh, beside the refill (which then builds
  // and destroys only); kRecyclers, at most one per sandbox.
  std::vector<std::thread> recyclers;

  std::atomic<std::uint64_t> warm_runs{0}, cold_runs{0}, recycled{0};
  std::unique_ptr<pool::SessionPool> sessions;

  void refill_loop();
  void recycle_loop();
  std::optional<Warm> take(const HostIds& owner);
  void give_back_used(Warm warm);                          // after a run: recycled, or destroyed
  void discard(std::unique_ptr<PreparedSandbox> sandbox);  // destroyed by the refill thread
  // Whether a sandbox that has served `runs` runs is recycled for another.
  bool comes_back(std::size_t runs) const { return options.recycle > 0 && runs < options.recycle; }
};

void Pool::State::refill_loop() {
  auto backoff = kFirstBackoff;
  std::unique_lock lock(mutex);
  while (!stopping) {
    const auto since_take = Clock::now() - last_take;
    if (since_take < kRefillQuiet && ready.size() > options.sandboxes / 4) {
      wake.wait_for(lock, kRefillQuiet - since_take, [this] { return stopping; });
      continue;
    }
    // Used sandboxes wait for a quiet moment too (tearing one down costs a run's worth of CPU),
    // unless as many have piled up as the pool holds: a pool never keeps more than twice its size.
    if (!used.empty() && (since_take >= kRefillQuiet || used.size() >= options.sandboxes)) {
      // Off the callers' path: killing what is left and removing the cgroup waits on the kernel.
      auto batch = std::move(used);
      used.clear();
      lock.unlock();
      batch.clear();
      lock.lock();
      continue;
    }
    if (ready.size() + returning < options.sandboxes) {
      lock.unlock();
      std::unique_ptr<PreparedSandbox> sandbox;
      try {
        sandbox = backend->build_ahead(policy);
        backoff = kFirstBackoff;
      } catch (const std::exception&) {
        // The cold path reports the same problem in its Result when a run needs one.
      }
      lock.lock();
      if (sandbox) {
        ready.push_back({std::move(sandbox), 0, std::nullopt});
      } else {
        wake.wait_for(lock, backoff, [this] { return stopping; });
        backoff = std::min(backoff * 2, kMaxBackoff);
      }
      continue;
    }
    if (!used.empty()) {  // held back above: until the takes pause
      wake.wait_for(lock, kRefillQuiet, [this] { return stopping; });
      continue;
    }
    wake.wait(lock, [this] {
      return stopping || !used.empty() || ready.size() + returning < options.sandboxes;
    });
  }
}

void Pool::State::recycle_loop() {
  std::unique_lock lock(mutex);
  for (;;) {
    recycle_wake.wait(lock, [this] { return stopping || !to_recycle.empty(); });
    if (stopping) return;
    Warm warm = std::move(to_recycle.front());
    to_recycle.pop_front();
    lock.unlock();
    // This thread starts the sandbox's next init, whose parent-death signal is this thread's: it
    // lives as long as the pool.
    const bool fresh = warm.sandbox->recycle();
    if (!fresh) warm.sandbox.reset();
    lock.lock();
    --returning;
    if (fresh) {
      ++recycled;
      ready.push_back(std::move(warm));
    } else {
      wake.notify_one();  // room for a new one
    }
  }
}

std::optional<Pool::State::Warm> Pool::State::take(const HostIds& owner) {
  for (;;) {
    Warm warm;
    {
      std::lock_guard lock(mutex);
      // The first one this caller may have: a recycled sandbox only for the identity it served.
      const auto it = std::find_if(ready.begin(), ready.end(), [&owner](const Warm& w) {
        return !w.owner || *w.owner == owner;
      });
      if (it == ready.end()) return std::nullopt;
      warm = std::move(*it);
      ready.erase(it);
      last_take = Clock::now();
    }
    if (!warm.sandbox->waiting()) {
      // Its init was killed while it waited: destroyed, and the next one.
      discard(std::move(warm.sandbox));
      continue;
    }
    warm.owner = owner;
    if (comes_back(warm.runs + 1)) {
      std::lock_guard lock(mutex);
      ++returning;  // the refill builds no replacement for it meanwhile
    }
    return warm;
  }
  // The refill thread is woken when this one comes back used (give_back_used), not now: building
  // the next sandbox while this run's payload starts takes the CPU the run needs (measured on 2
  // cores: Pool::run of /bin/true 7.7-8.5 ms median with the refill woken here, 5.4-5.7 ms
  // without; the same sustained throughput).
}

void Pool::State::give_back_used(Warm warm) {
  ++warm.runs;
  const bool expected = comes_back(warm.runs);
  {
    std::lock_guard lock(mutex);
    if (!stopping && expected) {
      to_recycle.push_back(std::move(warm));  // the recycler settles `returning`
      recycle_wake.notify_one();
    } else {
      if (expected) --returning;
      if (!stopping) used.push_back(std::move(warm.sandbox));
    }
  }
  wake.notify_one();
  // A pool being destroyed has no refill thread to hand it to: destroyed here.
}

void Pool::State::discard(std::unique_ptr<PreparedSandbox> sandbox) {
  {
    std::lock_guard lock(mutex);
    if (!stopping) used.push_back(std::move(sandbox));
  }
  wake.notify_one();
}

Pool::Pool(Policy policy, PoolOptions options) : state_(std::make_unique<State>()) {
  state_->backend = select_backend(policy);
  state_->policy = std::move(policy);
  state_->options = options;
  state_->warm = options.sandboxes > 0 && state_->backend->builds_ahead();
  if (state_->warm) {
    state_->shape = shape_of(state_->policy);
    // Every sandbox is built on this thread, which lives as long as the pool: a sandbox's first
    // process dies with the thread that cloned it (PR_SET_PDEATHSIG), so no other thread may.
    state_->refill = std::thread([state = state_.get()] { state->refill_loop(); });
    if (options.recycle > 1) {
      const std::size_t count = std::min<std::size_t>(kRecyclers, options.sandboxes);
      for (std::size_t i = 0; i < count; ++i)
        state_->recyclers.emplace_back([state = state_.get()] { state->recycle_loop(); });
    }
  }
  state_->sessions =
      std::make_unique<pool::SessionPool>(*state_->backend, state_->policy, options.sessions);
}

Pool::~Pool() {
  if (!state_) return;
  state_->sessions.reset();  // before the backend they run on
  if (state_->refill.joinable()) {
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->wake.notify_all();
    state_->recycle_wake.notify_all();
    state_->refill.join();
    for (auto& recycler : state_->recyclers) recycler.join();
  }
  // Every waiting init is killed with everything in it, reaped, and its cgroup removed.
  state_->ready.clear();
  state_->to_recycle.clear();
  state_->used.clear();
}

const Policy& Pool::policy() const {
  return state_->policy;
}

Result Pool::run(const Request& request) {
  return run(request, state_->policy);
}

Result Pool::run(const Request& request, const Policy& policy) {
  State& state = *state_;
  if (&policy != &state.policy) {
    if (const auto looser = limit_loosenings(state.policy.limits, policy.limits); !looser.empty()) {
      std::string list;
      for (const auto& limit : looser) list += (list.empty() ? "" : ", ") + limit.path;
      throw Error("the request loosens the pool's policy '" + state.policy.name + "': " + list +
                  " above the policy's");
    }
  }
  if (state.warm && (&policy == &state.policy || shape_of(policy) == state.shape)) {
    const HostIds owner = request.bind_owner.value_or(caller_ids());
    if (auto warm = state.take(owner)) {
      if (warm->sandbox->can_serve(policy.limits, owner)) {
        ++state.warm_runs;
        // A request the sandbox refuses (invalid) throws; it is given back all the same.
        struct GiveBack {
          State& state;
          State::Warm& warm;
          ~GiveBack() { state.give_back_used(std::move(warm)); }
        } give_back{state, *warm};
        return warm->sandbox->run(request, policy);
      }
      state.give_back_used(std::move(*warm));
    }
  }
  ++state.cold_runs;
  return state.backend->run(request, policy);
}

std::unique_ptr<Session> Pool::open_session(SessionOptions options) {
  return state_->sessions->open(std::move(options));
}

std::unique_ptr<Session> Pool::open_session(const Policy& policy, SessionOptions options) {
  return state_->backend->open_session(policy, std::move(options));
}

PoolStats Pool::stats() const {
  PoolStats stats;
  stats.warm_runs = state_->warm_runs;
  stats.cold_runs = state_->cold_runs;
  stats.recycled = state_->recycled;
  {
    std::lock_guard lock(state_->mutex);
    stats.ready_sandboxes = state_->ready.size();
  }
  stats.warm_sessions = state_->sessions->warm_opened();
  stats.cold_sessions = state_->sessions->cold_opened();
  stats.ready_sessions = state_->sessions->ready();
  return stats;
}

}  // namespace rlm
