// Backend selection fails closed: no policy that demands isolation ever runs unisolated, even one
// built in code that skipped the loader's validation.
#include <gtest/gtest.h>

#include <cstdlib>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm {
namespace {

TEST(BackendSelection, NeverPicksTheLocalBackendWithoutAllowUnisolated) {
  Policy policy;
  policy.backend.prefer = {"local"};
  policy.backend.allow_unisolated = false;
  EXPECT_THROW(select_backend(policy, "auto"), BackendUnavailable);
  try {
    select_backend(policy, "local");
    FAIL() << "an explicit --backend local must be refused too";
  } catch (const BackendUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find("allow_unisolated"), std::string::npos) << e.what();
  }
}

// Points the docker backend at a socket nobody listens on, so it is unavailable even where a
// Docker daemon runs (tools/test starts one for the docker backend's tests).
void without_docker() {
  setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock", 1);
}

TEST(BackendSelection, PicksLocalWhenThePolicyAllowsIt) {
  without_docker();
  Policy policy;
  policy.backend.prefer = {"docker", "local"};
  policy.backend.allow_unisolated = true;
  auto backend = select_backend(policy, "auto");
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "local");
}

TEST(BackendSelection, ExplainsEveryBackendItCouldNotUse) {
  Policy policy;
  policy.name = "demo";
  policy.backend.prefer = {"namespace", "docker"};
  // Without rlm-sandbox-init the namespace backend is unavailable, docker without a daemon.
  setenv("RLM_SANDBOX_INIT", "/nonexistent/rlm-sandbox-init", 1);
  without_docker();
  try {
    select_backend(policy, "auto");
    unsetenv("RLM_SANDBOX_INIT");
    FAIL() << "no isolating backend is available";
  } catch (const BackendUnavailable& e) {
    unsetenv("RLM_SANDBOX_INIT");
    const std::string message = e.what();
    EXPECT_NE(message.find("policy 'demo'"), std::string::npos) << message;
    EXPECT_NE(message.find("namespace:"), std::string::npos) << message;
    EXPECT_NE(message.find("docker:"), std::string::npos) << message;
    EXPECT_NE(message.find("rlm-sandbox-init not found"), std::string::npos) << message;
  }
}

TEST(BackendSelection, UnknownNamesAreErrorsNotUnavailability) {
  Policy policy;
  EXPECT_THROW(
      {
        try {
          select_backend(policy, "podman");
        } catch (const BackendUnavailable&) {
          FAIL() << "an unknown name is a usage mistake";
        }
      },
      Error);
}

}  // namespace
}  // namespace rlm
