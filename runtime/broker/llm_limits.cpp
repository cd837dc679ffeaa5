// limit_llm_handler: a concurrency cap with a queue, a per-call timeout and a per-session budget
// around any LlmHandler.
//
// Lifetime: the shared LimitState is owned by the returned handler, by the timer thread (until the
// handler is destroyed) and by each call thread (while the inner handler's answer() runs). Every
// thread is detached, so destroying the handler never waits on an inner handler that hangs; the
// done callbacks given to the inner handler hold the state weakly, so one it keeps forever does
// not keep the state alive either.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "broker/handlers.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"

namespace rlm {
namespace {

using Clock = std::chrono::steady_clock;
using Done = std::function<void(LlmAnswer)>;

// Far enough to mean "never", near enough that now() + it cannot overflow.
constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 365);

class LimitState : public std::enable_shared_from_this<LimitState> {
 public:
  LimitState(std::shared_ptr<LlmHandler> inner, LlmLimits limits)
      : inner_(std::move(inner)), limits_(limits), hands_calls_on_(inner_->hands_calls_on()) {}

  void start_timer() {
    std::thread([self = shared_from_this()] { self->run_timer(); }).detach();
    if (hands_calls_on_) std::thread([self = shared_from_this()] { self->run_hand_on(); }).detach();
  }

  void submit(LlmCall call, Done done) {
    Batch batch;
    {
      std::unique_lock lock(mutex_);
      if (accepted_ >= limits_.budget) {
        lock.unlock();
        done(LlmAnswer::of_error("LM call budget exhausted: this session allows " +
                                 std::to_string(limits_.budget) + " llm_query calls"));
        return;
      }
      ++accepted_;
      const std::uint64_t id = next_id_++;
      const auto deadline = Clock::now() + std::min(limits_.call_timeout, kLongestTimeout);
      unanswered_.emplace(id, Pending{std::move(call), std::move(done), deadline});
      waiting_.push_back(id);
      batch = take_startable();
    }
    timer_wakeup_.notify_one();
    start(std::move(batch));
  }

  // The handler is gone: every call not answered yet is answered with an error now (a late answer
  // from the inner handler is dropped), nothing more starts, and the timer thread ends.
  void close() {
    std::vector<Done> orphaned;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      for (auto& [id, pending] : unanswered_) orphaned.push_back(std::move(pending.done));
      unanswered_.clear();
      waiting_.clear();
      to_hand_on_.clear();
    }
    timer_wakeup_.notify_one();
    hand_on_wakeup_.notify_one();
    for (auto& done : orphaned)
      done(LlmAnswer::of_error("the LM handler was shut down before answering"));
  }

 private:
  struct Pending {
    LlmCall call;  // moved out when the call starts
    Done done;
    Clock::time_point deadline;
  };
  struct Batch {
    // Their slots taken (with a handler that hands calls on, they go to to_hand_on_ instead).
    std::vector<std::pair<std::uint64_t, LlmCall>> started;
    std::vector<Done> cancelled;  // cancelled while waiting: answered instead of started
  };

  // Under the lock: the waiting calls that now fit under the cap.
  Batch take_startable() {
    Batch batch;
    while (!closed_ && running_ < limits_.concurrency && !waiting_.empty()) {
      const std::uint64_t id = waiting_.front();
      waiting_.pop_front();
      const auto pending = unanswered_.find(id);
      if (pending == unanswered_.end()) continue;  // timed out while waiting
      if (pending->second.call.is_cancelled()) {
        batch.cancelled.push_back(std::move(pending->second.done));
        unanswered_.erase(pending);
        continue;
      }
      ++running_;
      // Queued for the hand-on thread here, under the lock, so that calls started by answers
      // finishing on several threads at once still queue in the order they came.
      if (hands_calls_on_)
        to_hand_on_.emplace_back(id, std::move(pending->second.call));
      else
        batch.started.emplace_back(id, std::move(pending->second.call));
    }
    return batch;
  }

  // Outside the lock. A thread per started call: the inner handler may block in answer() (the
  // built-in ones do). One that only hands calls on gets them from the hand-on thread, in order.
  void start(Batch batch) {
    for (auto& done : batch.cancelled) done(broker::cancelled_answer());
    if (hands_calls_on_) {
      hand_on_wakeup_.notify_one();
      return;
    }
    for (auto& [id, call] : batch.started) {
      try {
        // id = id: clang before 16 cannot capture a structured binding by name (the fuzz build).
        std::thread([self = shared_from_this(), id = id, call = std::move(call)]() mutable {
          self->call_inner(id, std::move(call));
        }).detach();
      } catch (const std::system_error& error) {
        finish(id, LlmAnswer::of_error("cannot start a thread for the LM call: " +
                                       std::string(error.what())));
      }
    }
  }

  void call_inner(std::uint64_t id, LlmCall call) {
    // Once only, whatever the inner handler does: its slot is freed exactly once.
    auto answered = std::make_shared<std::atomic<bool>>(false);
    Done done = [weak = weak_from_this(), id, answered](LlmAnswer answer) {
      if (answered->exchange(true)) return;
      if (auto self = weak.lock()) self->finish(id, std::move(answer));
    };
    try {
      inner_->answer(std::move(call), done);
    } catch (const std::exception& error) {
      done(LlmAnswer::of_error("the LM handler failed: " + std::string(error.what())));
    } catch (...) {
      done(LlmAnswer::of_error("the LM handler failed"));
    }
  }

  // The inner handler answered a started call (possibly after its timeout): its slot is freed,
  // the caller gets the answer if it still waits, and what now fits under the cap starts.
  void finish(std::uint64_t id, LlmAnswer answer) {
    Done done;
    Batch batch;
    {
      std::lock_guard lock(mutex_);
      --running_;
      if (const auto pending = unanswered_.find(id); pending != unanswered_.end()) {
        done = std::move(pending->second.done);
        unanswered_.erase(pending);
      }
      batch = take_startable();
    }
    start(std::move(batch));
    if (done) done(std::move(answer));
  }

  // Hands started calls to the inner handler one at a time, in the order they started, until
  // the handler is closed (calls still queued then were answered by close()).
  void run_hand_on() {
    std::unique_lock lock(mutex_);
    for (;;) {
      hand_on_wakeup_.wait(lock, [&] { return closed_ || !to_hand_on_.empty(); });
      if (closed_) return;
      auto [id, call] = std::move(to_hand_on_.front());
      to_hand_on_.pop_front();
      lock.unlock();
      if (call.is_cancelled())  // its cell ended while it queued here: not handed on
        finish(id, broker::cancelled_answer());
      else
        call_inner(id, std::move(call));
      lock.lock();
    }
  }

  void run_timer() {
    const std::string message =
        "LM call timed out after " + std::to_string(limits_.call_timeout.count()) + " ms";
    std::unique_lock lock(mutex_);
    while (!closed_) {
      if (unanswered_.empty()) {
        timer_wakeup_.wait(lock);
        continue;
      }
      // Every call has the same timeout, so arrival order (the map's) is deadline order.
      if (const auto earliest = unanswered_.begin()->second.deadline; Clock::now() < earliest) {
        timer_wakeup_.wait_until(lock, earliest);
        continue;
      }
      std::vector<Done> expired;
      const auto now = Clock::now();
      for (auto pending = unanswered_.begin();
           pending != unanswered_.end() && pending->second.deadline <= now;) {
        expired.push_back(std::move(pending->second.done));
        pending = unanswered_.erase(pending);
      }
      lock.unlock();
      for (auto& done : expired) done(LlmAnswer::of_error(message));
      lock.lock();
    }
  }

  const std::shared_ptr<LlmHandler> inner_;
  const LlmLimits limits_;
  const bool hands_calls_on_;
  std::mutex mutex_;
  std::condition_variable timer_wakeup_;
  std::condition_variable hand_on_wakeup_;
  // Started calls of a handler that hands_calls_on(), for the hand-on thread, in start order.
  std::deque<std::pair<std::uint64_t, LlmCall>> to_hand_on_;
  bool closed_ = false;
  std::size_t accepted_ = 0;  // counts against the budget
  std::size_t running_ = 0;   // handed to the inner handler and not answered by it yet
  std::uint64_t next_id_ = 0;
  std::map<std::uint64_t, Pending> unanswered_;  // whose caller still waits, by arrival
  std::deque<std::uint64_t> waiting_;            // not started yet (or timed out meanwhile)
};

class LimitedHandler final : public LlmHandler {
 public:
  explicit LimitedHandler(std::shared_ptr<LimitState> state) : state_(std::move(state)) {}
  ~LimitedHandler() override { state_->close(); }
  LimitedHandler(const LimitedHandler&) = delete;
  LimitedHandler& operator=(const LimitedHandler&) = delete;

  void answer(LlmCall call, Done done) override {
    state_->submit(std::move(call), std::move(done));
  }

 private:
  std::shared_ptr<LimitState> state_;
};

}  // namespace

std::shared_ptr<LlmHandler> limit_llm_handler(std::shared_ptr<LlmHandler> inner, LlmLimits limits) {
  if (!inner) throw Error("limit_llm_handler: no handler to limit");
  if (limits.concurrency == 0) throw Error("LM limits: concurrency must be at least 1");
  if (limits.call_timeout.count() <= 0) throw Error("LM limits: call_timeout must be positive");
  auto state = std::make_shared<LimitState>(std::move(inner), limits);
  auto handler = std::make_shared<LimitedHandler>(state);
  state->start_timer();  // last: if it throws, the handler's destruction closes the state
  return handler;
}

}  // namespace rlm
