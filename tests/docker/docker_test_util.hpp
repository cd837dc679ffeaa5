// Shared helpers for the docker backend tests: the daemon and image tools/docker-env provides,
// policies for the busybox test image, one-call runs, and the containers this process owns.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "docker/docker_backend.hpp"
#include "docker/engine_api.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::test {

using namespace std::chrono_literals;

inline constexpr const char* kTestImage = "rlm-sandbox-test:busybox";

// Why the daemon or the test image is not available ("" when both are); set up once per binary
// by the environment in docker_environment.cpp.
const std::string& docker_unavailable();

#define REQUIRE_DOCKER()                                                              \
  do {                                                                                \
    if (!::rlm::test::docker_unavailable().empty())                                   \
      GTEST_SKIP() << "no Docker daemon here: " << ::rlm::test::docker_unavailable(); \
  } while (0)

// The shipped default policy (read-only binds of the host's /usr and friends, tmpfs /tmp, uid
// 1000, no network) on the busybox test image, with room for a loaded machine. With /usr bound,
// the host's python3 runs inside.
Policy docker_policy();
// The image alone: its busybox applets, a tmpfs on /tmp, nothing from the host.
Policy busybox_policy();

Result run_docker(const std::vector<std::string>& argv, const Policy& policy = docker_policy(),
                  Request request = {});
Result run_docker_sh(const std::string& script, const Policy& policy = busybox_policy(),
                     Request request = {});

std::string describe(const Result& result);

docker::EngineApi test_api();
// Ids of containers labelled rlm-sandbox=1 matching `label_filter` ("rlm-sandbox.session=ID"),
// running or not.
std::vector<std::string> labelled_containers(const std::string& label_filter = "rlm-sandbox=1");
// Those whose owner label names this process.
std::vector<std::string> containers_of_this_process();

}  // namespace rlm::test
