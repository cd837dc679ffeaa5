// Backend selection fails closed: no policy that demands isolation ever runs unisolated, even one
// built in code that skipped the loader's validation.
#include <gtest/gtest.h>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "support/scoped_env.hpp"

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

// Points the docker backend at a socket nobody listens on while it lives, so the backend is
// unavailable even where a Docker daemon runs (tools/test starts one for the docker backend's
// tests); the variable is restored afterwards, so later tests in this process see the daemon.
class WithoutDocker : public test::ScopedEnv {
 public:
  WithoutDocker() : ScopedEnv("DOCKER_HOST", "unix:///nonexistent/docker.sock") {}
};

TEST(BackendSelection, PicksLocalWhenThePolicyAllowsIt) {
  WithoutDocker without_docker;
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
  test::ScopedEnv without_init("RLM_SANDBOX_INIT", "/nonexistent/rlm-sandbox-init");
  WithoutDocker without_docker;
  try {
    select_backend(policy, "auto");
    FAIL() << "no isolating backend is available";
  } catch (const BackendUnavailable& e) {
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
