// An egress allowlist on the docker backend: the same rules (egress_suite.cpp, instantiated
// here) with the same host side, the payload's container in a holder container's network
// namespace (docker/egress_holder.hpp); and what only this backend has -- the holder's
// removal, and a session narrowed on it.
#include <chrono>

#include "docker_test_util.hpp"
#include "egress_credentials.hpp"
#include "egress_suite.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::test {

std::string egress_backend_unavailable(const std::string&) {
  return docker_unavailable().empty() ? "" : "no Docker daemon here: " + docker_unavailable();
}

INSTANTIATE_TEST_SUITE_P(On, EgressSuite, ::testing::Values("docker"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(On, EgressCredentials, ::testing::Values("docker"),
                         [](const auto& info) { return info.param; });

namespace {

using namespace std::chrono_literals;
using nlohmann::json;

class EgressDocker : public EgressFixture {
 protected:
  void SetUp() override {
    REQUIRE_DOCKER();
    backend_ = "docker";
    EgressFixture::SetUp();
  }
};

// The holder carries the run's labels and goes with it: nothing labelled by this process is
// left, whether the run ended well or by its wall time.
TEST_F(EgressDocker, TheHolderContainerGoesWithTheRun) {
  auto allowed = policy({{"allow", {"echo.test:5432"}}});
  const auto ok =
      python("print(exchange(socket.gethostbyname('echo.test'), 5432, b'hi'))", allowed);
  ASSERT_EQ(ok.status, Status::ok) << describe(ok);
  EXPECT_EQ(ok.stdout_data, "b'hi'\n");
  EXPECT_TRUE(containers_of_this_process().empty());
  allowed.limits.wall_time = 2s;
  const auto timed_out = python("time.sleep(30)", allowed);
  EXPECT_EQ(timed_out.status, Status::timeout) << describe(timed_out);
  EXPECT_TRUE(containers_of_this_process().empty());
}

// A docker session's allowlist narrows while it runs, as the namespace backend's does.
TEST_F(EgressDocker, ASessionsAllowlistNarrowsWhileItRuns) {
  Policy repl = load_policy_text(json{{"extends", "python-repl"},
                                      {"network", {{"allow", {"pypi.test:443", "echo.test:5432"}}}},
                                      {"docker", {{"image", "rlm-sandbox-test:busybox"}}},
                                      {"limits", {{"wall_time_ms", "60s"}, {"cpu_time_ms", "60s"}}}}
                                     .dump(),
                                 "egress-repl.json");
  world_.bind_into(repl);
  auto session = make_backend("docker")->open_session(repl, {});
  const auto setup = session->execute(std::string(kPrelude) + R"PY(
kept = socket.create_connection(("echo.test", 5432), timeout=10)
kept.sendall(b"one")
print(kept.recv(16))
)PY",
                                      std::chrono::seconds(40));
  ASSERT_EQ(setup.status, CellStatus::ok) << setup.error << setup.stderr_data;
  EXPECT_EQ(setup.stdout_data, "b'one'\n");
  session->narrow_network({"pypi.test:443"});
  const auto after = session->execute(R"PY(
try:
    kept.sendall(b"two")
    print(kept.recv(16) or b"ended")
except OSError as error:
    print("ended")
print(outcome(socket.gethostbyname, "echo.test"))
print(https_get("pypi.test"))
)PY",
                                      std::chrono::seconds(40));
  ASSERT_EQ(after.status, CellStatus::ok) << after.error << after.stderr_data;
  EXPECT_TRUE(after.stdout_data == "b'ended'\nerror:gaierror\ntls ok sni=pypi.test\n" ||
              after.stdout_data == "ended\nerror:gaierror\ntls ok sni=pypi.test\n")
      << after.stdout_data;
  EXPECT_THROW(session->narrow_network({"echo.test:5432"}), Error);
  session->close();
  EXPECT_TRUE(containers_of_this_process().empty());
}

}  // namespace
}  // namespace rlm::test
