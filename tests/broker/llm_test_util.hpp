// Helpers for the LM handler tests: waiting for answers, counting done calls, the environment.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rlm_sandbox/llm.hpp"

namespace rlm::test {

// Records every done call by index; callbacks share ownership, so they may outlive the test body.
class Answers : public std::enable_shared_from_this<Answers> {
 public:
  std::function<void(LlmAnswer)> callback(std::size_t index) {
    return [self = shared_from_this(), index](LlmAnswer answer) {
      std::lock_guard lock(self->mutex_);
      if (++self->times_done_[index] == 1) self->answers_.emplace(index, std::move(answer));
      self->changed_.notify_all();
    };
  }
  // True once `count` distinct calls have been answered.
  bool wait_for(std::size_t count, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return answers_.size() >= count; });
  }
  LlmAnswer at(std::size_t index) {
    std::lock_guard lock(mutex_);
    return answers_.at(index);
  }
  int times_done(std::size_t index) {
    std::lock_guard lock(mutex_);
    return times_done_.count(index) ? times_done_[index] : 0;
  }
  std::size_t answered() {
    std::lock_guard lock(mutex_);
    return answers_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::size_t, LlmAnswer> answers_;
  std::map<std::size_t, int> times_done_;
};

inline LlmCall call_of(std::string prompt, std::optional<std::string> model = std::nullopt) {
  LlmCall call;
  call.prompt = std::move(prompt);
  call.model = std::move(model);
  return call;
}

// One call, waited for; fails the test when no answer comes in time.
inline LlmAnswer ask(LlmHandler& handler, LlmCall call) {
  auto answers = std::make_shared<Answers>();
  handler.answer(std::move(call), answers->callback(0));
  if (!answers->wait_for(1)) {
    ADD_FAILURE() << "no answer within 30 s";
    return LlmAnswer::of_error("no answer");
  }
  return answers->at(0);
}
inline LlmAnswer ask(LlmHandler& handler, std::string prompt,
                     std::optional<std::string> model = std::nullopt) {
  return ask(handler, call_of(std::move(prompt), std::move(model)));
}

// Sets (or, with nullopt, unsets) an environment variable for the scope; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? setenv(name, value->c_str(), 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::size_t thread_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++count;
  return count;
}

}  // namespace rlm::test
