// An environment variable set (or unset) for one scope, and restored as it was when the scope
// ends, even when the test fails in between: no test leaks its environment into the next one run
// in the same process.
#pragma once

#include <stdlib.h>

#include <optional>
#include <string>

namespace rlm::test {

class ScopedEnv {
 public:
  // Sets `name` to `value`, or unsets it when `value` is nullopt.
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = ::getenv(name_.c_str())) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) const {
    if (value)
      ::setenv(name_.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace rlm::test
