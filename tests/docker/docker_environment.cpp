// Brings up the daemon and the test image once per test binary (tools/docker-env), and checks at
// the end that this process left no labelled container behind.
#include <unistd.h>

#include "docker_test_util.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

std::string g_unavailable = "the docker test environment was not set up";

class DockerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    ProcessOptions options;
    options.kill_after = 300s;  // a first setup installs packages
    const auto setup = run_process({source_path("tools/docker-env")}, options);
    if (setup.exit_code != 0) {
      g_unavailable =
          "tools/docker-env failed (exit " + std::to_string(setup.exit_code) + "): " + setup.err;
      return;
    }
    g_unavailable.clear();
  }

  void TearDown() override {
    if (!g_unavailable.empty()) return;
    const auto left = containers_of_this_process();
    EXPECT_TRUE(left.empty()) << left.size() << " labelled container(s) of this process remain";
    for (const auto& id : left) test_api().call("DELETE", "/containers/" + id + "?force=1");
  }
};

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new DockerEnvironment);

}  // namespace

const std::string& docker_unavailable() {
  return g_unavailable;
}

Policy docker_policy() {
  Policy policy = load_policy("default");
  policy.docker.image = kTestImage;
  policy.limits.wall_time = 30s;
  policy.limits.cpu_time = 30s;
  return policy;
}

Policy busybox_policy() {
  Policy policy = docker_policy();
  Mount tmp;
  tmp.type = Mount::Type::tmpfs;
  tmp.target = "/tmp";
  tmp.readonly = false;
  policy.filesystem.mounts = {tmp};
  policy.env.set["PATH"] = "/bin";
  return policy;
}

Result run_docker(const std::vector<std::string>& argv, const Policy& policy, Request request) {
  request.argv = argv;
  return docker::make_docker_backend()->run(request, policy);
}

Result run_docker_sh(const std::string& script, const Policy& policy, Request request) {
  return run_docker({"sh", "-c", script}, policy, std::move(request));
}

std::string describe(const Result& result) {
  return result.to_json().dump();
}

docker::EngineApi test_api() {
  return docker::EngineApi(docker::endpoint_from_environment().socket_path);
}

std::vector<std::string> labelled_containers(const std::string& label_filter) {
  const nlohmann::json filters = {{"label", {"rlm-sandbox=1", label_filter}}};
  const auto list = test_api().expect_json(
      "GET", "/containers/json?all=1&filters=" + docker::url_encode(filters.dump()));
  std::vector<std::string> ids;
  for (const auto& container : list) ids.push_back(container["Id"].get<std::string>());
  return ids;
}

std::vector<std::string> containers_of_this_process() {
  const nlohmann::json filters = {{"label", {"rlm-sandbox=1"}}};
  const auto list = test_api().expect_json(
      "GET", "/containers/json?all=1&filters=" + docker::url_encode(filters.dump()));
  const std::string prefix = std::to_string(getpid()) + "-";
  std::vector<std::string> ids;
  for (const auto& container : list) {
    const auto owner = container["Labels"].value("rlm-sandbox.owner", std::string());
    if (owner.starts_with(prefix)) ids.push_back(container["Id"].get<std::string>());
  }
  return ids;
}

}  // namespace rlm::test
