// A test fixture for sessions on the namespace backend under the `python-repl` policy, with a
// 10 s cell limit.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::test {

class NamespaceSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    policy_ = load_policy("python-repl");
    policy_.limits.wall_time = std::chrono::seconds(10);
    backend_ = make_backend("namespace");
    ASSERT_TRUE(backend_);
  }
  std::unique_ptr<Session> open(SessionOptions options = {}) {
    return backend_->open_session(policy_, std::move(options));
  }

  Policy policy_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace rlm::test
