// The errors a user of the docker backend meets, each saying what is wrong and how to fix it: no
// daemon, a socket they may not use, a missing image, Docker's own refusals, policy fields Docker
// cannot honour -- and containers a crashed runtime left, collected by the next one.
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "docker/container_control.hpp"
#include "docker/container_spec.hpp"
#include "docker/ownership.hpp"
#include "docker_test_util.hpp"
#include "host/unique_fd.hpp"
#include "support/scoped_env.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

TEST(DockerErrors, NoDaemonSaysHowToStartOne) {
  TempDir dir;
  ScopedEnv host("DOCKER_HOST", "unix://" + dir.file("docker.sock"));
  auto backend = docker::make_docker_backend();
  const auto reason = backend->unavailable_reason();
  EXPECT_NE(reason.find("the Docker daemon is not running"), std::string::npos) << reason;
  EXPECT_NE(reason.find("dockerd &"), std::string::npos) << reason;
  const auto health = backend->health();
  EXPECT_FALSE(health.available);
  EXPECT_NE(health.fix.find("systemctl start docker"), std::string::npos) << health.fix;

  const auto result = run_docker({"true"});
  EXPECT_EQ(result.status, Status::sandbox_error);
  EXPECT_NE(result.detail.find("does not exist; start it: dockerd &"), std::string::npos)
      << result.detail;

  // A socket file nobody listens on.
  {
    host::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const auto path = dir.file("docker.sock");
    path.copy(address.sun_path, path.size());
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  }
  const auto refused = backend->unavailable_reason();
  EXPECT_NE(refused.find("nothing listens on"), std::string::npos) << refused;
}

TEST(DockerErrors, ASocketThePayloadUserMayNotUseSaysToJoinTheDockerGroup) {
  REQUIRE_DOCKER();
  // As an unprivileged uid in a child process: root would pass any permission check.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string socket_path = docker::endpoint_from_environment().socket_path;
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const std::string problem = docker::socket_problem(socket_path);
    (void)!write(pipe_fds[1], problem.data(), problem.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string problem;
  char buffer[1024];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) problem.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(problem.find("permission denied on the Docker socket"), std::string::npos) << problem;
  EXPECT_NE(problem.find("add your user to the docker group"), std::string::npos) << problem;
}

TEST(DockerErrors, ADaemonElsewhereIsNotGuessedAt) {
  ScopedEnv host("DOCKER_HOST", "tcp://127.0.0.1:2375");
  const auto reason = docker::make_docker_backend()->unavailable_reason();
  EXPECT_NE(reason.find("unix socket only"), std::string::npos) << reason;
}

TEST(DockerErrors, AMissingImageSaysHowToGetIt) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.docker.image = "rlm-sandbox-test:no-such-tag";
  const auto result = run_docker({"true"}, policy);
  EXPECT_EQ(result.status, Status::sandbox_error);
  EXPECT_NE(result.detail.find("the image rlm-sandbox-test:no-such-tag is not in the Docker "
                               "daemon's image store"),
            std::string::npos)
      << result.detail;
  EXPECT_NE(result.detail.find("docker pull rlm-sandbox-test:no-such-tag"), std::string::npos);
  EXPECT_NE(result.detail.find("docker import"), std::string::npos);
}

TEST(DockerErrors, DockersOwnRefusalIsPassedOn) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.limits.memory_bytes = 1 << 20;  // below Docker's minimum
  const auto result = run_docker({"true"}, policy);
  EXPECT_EQ(result.status, Status::sandbox_error);
  EXPECT_NE(result.detail.find("Docker refused POST /containers/create (HTTP 400): "),
            std::string::npos)
      << result.detail;
  EXPECT_NE(result.detail.find("Minimum memory limit"), std::string::npos) << result.detail;
  EXPECT_TRUE(containers_of_this_process().empty());
}

TEST(DockerErrors, PolicyFieldsDockerCannotHonourAreErrorsNamingThem) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.capabilities = {"CAP_NET_RAW"};
  try {
    run_docker({"true"}, policy);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("capabilities: Docker gives added capabilities"),
              std::string::npos)
        << error.what();
  }
  Request request;
  request.inherit_fds = {5};
  EXPECT_THROW(run_docker({"true"}, busybox_policy(), request), Error);
  EXPECT_TRUE(containers_of_this_process().empty()) << "refused before anything was created";
}

TEST(DockerErrors, HealthReportsTheDaemonAndWhatItEnforces) {
  REQUIRE_DOCKER();
  const auto health = docker::make_docker_backend()->health();
  EXPECT_TRUE(health.available) << health.detail;
  EXPECT_TRUE(health.isolated);
  EXPECT_NE(health.detail.find("API 1."), std::string::npos) << health.detail;
  EXPECT_NE(std::find(health.enforced.begin(), health.enforced.end(), "limits.memory_bytes"),
            health.enforced.end());
  EXPECT_EQ(docker::make_docker_backend()->unavailable_reason(), "");
}

TEST(DockerErrors, ContainersOfACrashedRuntimeAreCollectedAndNoOthers) {
  REQUIRE_DOCKER();
  const auto api = test_api();
  // A runtime that crashed: a child that made its id and outlives the start of its container, then
  // exits. Until then the container is not stale, so no other test process's collector (each
  // process's first docker run collects) can remove it before it has started.
  int id_pipe[2], exit_pipe[2];
  ASSERT_EQ(pipe(id_pipe), 0);
  ASSERT_EQ(pipe(exit_pipe), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(exit_pipe[1]);
    const std::string id = docker::new_owned_id();
    (void)!write(id_pipe[1], id.data(), id.size());
    char go;
    (void)!read(exit_pipe[0], &go, 1);
    _exit(0);
  }
  close(id_pipe[1]);
  close(exit_pipe[0]);
  char buffer[128];
  const ssize_t length = read(id_pipe[0], buffer, sizeof buffer);
  close(id_pipe[0]);
  ASSERT_GT(length, 0);
  const std::string dead_owner(buffer, static_cast<size_t>(length));

  const auto make = [&](const std::string& owner) {
    docker::ContainerPlan plan;
    plan.command = {"sleep", "60"};
    plan.session = "leftover-test";
    plan.owner = owner;
    return docker::create_container(api, docker::create_body(busybox_policy(), plan),
                                    "rlm-sandbox-" + docker::new_owned_id());
  };
  const auto orphan = make(dead_owner);
  docker::start_container(api, orphan);
  close(exit_pipe[1]);  // now the owner dies
  waitpid(child, nullptr, 0);
  const auto ours = make(docker::new_owned_id());

  docker::collect_stale_containers(api);
  // Another test process's first run may be collecting the same orphan right now; its removal
  // can still be in progress when ours returns.
  auto left = labelled_containers("rlm-sandbox.session=leftover-test");
  for (int i = 0; i < 100 && left.size() > 1; ++i) {
    std::this_thread::sleep_for(50ms);
    left = labelled_containers("rlm-sandbox.session=leftover-test");
  }
  EXPECT_EQ(left, std::vector<std::string>{ours}) << "the orphan went, ours (alive) stayed";
  docker::remove_container(api, ours);
  docker::remove_container(api, orphan);
}

}  // namespace
}  // namespace rlm::test
