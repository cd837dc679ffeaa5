// Policy -> POST /containers/create body: every field the docker backend maps, and every field it
// refuses, named by its JSON path.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "docker/container_spec.hpp"
#include "docker/ownership.hpp"
#include "seccomp/seccomp.hpp"
#include "support/python_venv.hpp"
#include "support/subprocess.hpp"

namespace rlm::docker {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

ContainerPlan plan_for(std::vector<std::string> command) {
  ContainerPlan plan;
  plan.command = std::move(command);
  plan.environment = {"PATH=/usr/bin:/bin", "HOME=/tmp"};
  plan.session = "session-1";
  plan.owner = new_owned_id();
  return plan;
}

nlohmann::json mount_at(const nlohmann::json& body, const std::string& target) {
  for (const auto& mount : body["HostConfig"]["Mounts"])
    if (mount["Target"] == target) return mount;
  return nullptr;
}

std::vector<std::string> paths_of(const std::vector<Diagnostic>& problems) {
  std::vector<std::string> paths;
  for (const auto& problem : problems) paths.push_back(problem.path);
  return paths;
}

TEST(DockerContainerSpec, MapsLimitsOntoTheHostConfig) {
  Policy policy = load_policy("default");
  policy.limits.memory_bytes = 64ull << 20;
  policy.limits.pids = 32;
  policy.limits.cpu_time = 2500ms;
  policy.limits.file_size_bytes = 1ull << 20;
  policy.limits.open_files = 100;
  const auto body = create_body(policy, plan_for({"echo", "hi"}));
  const auto& host = body["HostConfig"];
  EXPECT_EQ(host["Memory"], 64ull << 20);
  EXPECT_EQ(host["MemorySwap"], 64ull << 20) << "equal to Memory: no swap";
  EXPECT_EQ(host["PidsLimit"], 32);
  const nlohmann::json expected_ulimits = {
      {{"Name", "cpu"}, {"Soft", 3}, {"Hard", 4}},
      {{"Name", "fsize"}, {"Soft", 1 << 20}, {"Hard", 1 << 20}},
      {{"Name", "nofile"}, {"Soft", 100}, {"Hard", 100}},
      {{"Name", "core"}, {"Soft", 0}, {"Hard", 0}},
  };
  EXPECT_EQ(host["Ulimits"], expected_ulimits);
  EXPECT_FALSE(host.contains("NanoCpus")) << "the policy has a CPU-time budget, not a CPU share";
}

// limits.cpus is Docker's --cpus: NanoCpus, billionths of a CPU for the whole container.
TEST(DockerContainerSpec, MapsCpusOntoNanoCpus) {
  Policy policy = load_policy("default");
  policy.limits.cpus = 0.5;
  EXPECT_EQ(create_body(policy, plan_for({"true"}))["HostConfig"]["NanoCpus"], 500'000'000);
  policy.limits.cpus = 2;
  EXPECT_EQ(create_body(policy, plan_for({"true"}))["HostConfig"]["NanoCpus"], 2'000'000'000);
}

TEST(DockerContainerSpec, LocksThePayloadDown) {
  Policy policy = load_policy("default");
  const auto body = create_body(policy, plan_for({"id"}));
  const auto& host = body["HostConfig"];
  EXPECT_EQ(host["CapDrop"], nlohmann::json({"ALL"}));
  EXPECT_EQ(host["CapAdd"], nlohmann::json::array());
  ASSERT_EQ(host["SecurityOpt"].size(), 2u);
  EXPECT_EQ(host["SecurityOpt"][0], "no-new-privileges");
  EXPECT_EQ(host["SecurityOpt"][1], "seccomp=" + seccomp::docker_profile(policy.seccomp).dump());
  EXPECT_EQ(host["ReadonlyRootfs"], true);
  EXPECT_EQ(host["NetworkMode"], "none");
  EXPECT_EQ(host["Init"], true);
  EXPECT_EQ(host["LogConfig"]["Type"], "none");
  EXPECT_EQ(body["User"], "1000:1000");
  EXPECT_EQ(body["Entrypoint"], nlohmann::json::array());
  EXPECT_EQ(body["Cmd"], nlohmann::json({"id"}));
  EXPECT_EQ(body["Env"], nlohmann::json({"PATH=/usr/bin:/bin", "HOME=/tmp"}));
  EXPECT_EQ(body["Hostname"], "sandbox");
  EXPECT_EQ(body["WorkingDir"], "/tmp");
  EXPECT_EQ(body["Image"], "python:3.12-slim");
  EXPECT_EQ(host["IpcMode"], "private");
  EXPECT_EQ(host["CgroupnsMode"], "private");
  EXPECT_EQ(host["PidMode"], "");
  EXPECT_EQ(body["OpenStdin"], false);
}

TEST(DockerContainerSpec, LabelsTheContainerWithItsSessionAndOwner) {
  auto plan = plan_for({"true"});
  const auto body = create_body(load_policy("default"), plan);
  const auto& labels = body["Labels"];
  EXPECT_EQ(labels["rlm-sandbox"], "1");
  EXPECT_EQ(labels["rlm-sandbox.session"], "session-1");
  EXPECT_EQ(labels["rlm-sandbox.owner"], plan.owner);
  EXPECT_EQ(labels["rlm-sandbox.boot"], boot_id());
  EXPECT_EQ(owner_state(plan.owner, boot_id()), OwnerState::alive);
}

TEST(DockerContainerSpec, MapsBindsTmpfsAndWorkdir) {
  Policy policy = load_policy("default");
  policy.filesystem.mounts.clear();
  Mount usr{"/usr", "/usr", Mount::Type::bind, true, std::nullopt, false};
  Mount data{"/var", "/data", Mount::Type::bind, false, std::nullopt, false};
  Mount missing{"/no/such/dir", "/opt/x", Mount::Type::bind, true, std::nullopt, true};
  Mount tmp{"", "/tmp", Mount::Type::tmpfs, false, std::nullopt, false};
  Mount cache{"", "/cache", Mount::Type::tmpfs, false, 8ull << 20, false};
  policy.filesystem.mounts = {usr, data, missing, tmp, cache};
  policy.filesystem.workdir = "/data";
  policy.limits.tmpfs_bytes = 32ull << 20;
  const auto body = create_body(policy, plan_for({"true"}));

  EXPECT_EQ(body["HostConfig"]["Mounts"].size(), 4u) << "the optional bind of a missing source "
                                                        "is left out";
  const auto usr_mount = mount_at(body, "/usr");
  EXPECT_EQ(usr_mount["Type"], "bind");
  EXPECT_EQ(usr_mount["Source"], "/usr");
  EXPECT_EQ(usr_mount["ReadOnly"], true);
  EXPECT_EQ(usr_mount["BindOptions"]["Propagation"], "rprivate");
  EXPECT_EQ(mount_at(body, "/data")["ReadOnly"], false);
  EXPECT_TRUE(mount_at(body, "/opt/x").is_null());
  const auto tmp_mount = mount_at(body, "/tmp");
  EXPECT_EQ(tmp_mount["Type"], "tmpfs");
  EXPECT_EQ(tmp_mount["TmpfsOptions"]["SizeBytes"], 32ull << 20) << "limits.tmpfs_bytes";
  EXPECT_EQ(tmp_mount["TmpfsOptions"]["Mode"], 01777);
  EXPECT_EQ(mount_at(body, "/cache")["TmpfsOptions"]["SizeBytes"], 8ull << 20);
  EXPECT_EQ(mount_at(body, "/cache")["TmpfsOptions"]["Mode"], 0755);
  EXPECT_EQ(body["WorkingDir"], "/data");

  policy.filesystem.workdir = "";
  EXPECT_EQ(create_body(policy, plan_for({"true"}))["WorkingDir"], "/") << "the sandbox root";
}

// The policy's Python environment: read-only volumes at the host paths, in addition to the
// policy's mounts; a directory the host no longer has as loaded is refused before any container.
TEST(DockerContainerSpec, BindsThePythonEnvironmentReadOnlyAtItsHostPaths) {
  test::PythonVenv venv;
  Policy policy = load_policy("python-repl");
  const auto policy_mounts = load_policy("python-repl").filesystem.mounts.size();
  policy.python.venv = venv.path();
  policy.python.site_packages = {venv.plain_site()};
  const auto body = create_body(policy, plan_for({"python3"}));
  for (const auto& dir : {venv.path(), venv.plain_site()}) {
    const auto mount = mount_at(body, dir);
    ASSERT_FALSE(mount.is_null()) << dir << " in " << body["HostConfig"]["Mounts"].dump();
    EXPECT_EQ(mount["Type"], "bind");
    EXPECT_EQ(mount["Source"], dir);
    EXPECT_EQ(mount["ReadOnly"], true);
  }
  EXPECT_LE(body["HostConfig"]["Mounts"].size(), policy_mounts + 2);

  ASSERT_EQ(::chmod(venv.plain_site().c_str(), 0777), 0);
  EXPECT_THROW(create_body(policy, plan_for({"python3"})), Error);
}

TEST(DockerContainerSpec, LeavesTheImagesOwnBinWhenTheHostsIsALinkIntoABoundUsr) {
  Policy policy = load_policy("default");
  const auto body = create_body(policy, plan_for({"true"}));
  struct stat info {};
  for (const char* path : {"/bin", "/sbin", "/lib", "/lib64"}) {
    const bool link_into_usr = lstat(path, &info) == 0 && S_ISLNK(info.st_mode);
    if (link_into_usr) {
      EXPECT_TRUE(mount_at(body, path).is_null()) << path << " is a link into the bound /usr";
    }
  }
  EXPECT_EQ(mount_at(body, "/usr")["Source"], "/usr");
  EXPECT_EQ(body["HostConfig"]["Init"], true);

  // A real directory on /sbin would hide Docker's init there: the payload is PID 1 instead.
  TempDir sbin;
  policy.filesystem.mounts.push_back({sbin.path(), "/sbin", Mount::Type::bind, true, {}, false});
  policy.filesystem.mounts.erase(
      std::remove_if(policy.filesystem.mounts.begin(), policy.filesystem.mounts.end(),
                     [](const Mount& m) { return m.target == "/sbin" && m.source == "/sbin"; }),
      policy.filesystem.mounts.end());
  EXPECT_EQ(create_body(policy, plan_for({"true"}))["HostConfig"]["Init"], false);
}

TEST(DockerContainerSpec, MapsNetworkHostAndSharedNamespaces) {
  Policy policy = load_policy("default");
  policy.network = Network::host;
  policy.namespaces.net = false;
  policy.namespaces.pid = false;
  policy.namespaces.ipc = false;
  policy.namespaces.uts = false;
  policy.namespaces.cgroup = false;
  const auto body = create_body(policy, plan_for({"true"}));
  const auto& host = body["HostConfig"];
  EXPECT_EQ(host["NetworkMode"], "host");
  EXPECT_EQ(host["PidMode"], "host");
  EXPECT_EQ(host["IpcMode"], "host");
  EXPECT_EQ(host["UTSMode"], "host");
  EXPECT_EQ(host["CgroupnsMode"], "host");
  EXPECT_FALSE(body.contains("Hostname")) << "a shared UTS namespace keeps the host's name";
}

TEST(DockerContainerSpec, AttachesStdinOnlyWhenThePayloadGetsSome) {
  auto plan = plan_for({"cat"});
  plan.open_stdin = true;
  const auto body = create_body(load_policy("default"), plan);
  EXPECT_EQ(body["OpenStdin"], true);
  EXPECT_EQ(body["StdinOnce"], true);
  EXPECT_EQ(body["AttachStdin"], true);
}

TEST(DockerContainerSpec, TheShippedPoliciesAreSupported) {
  for (const auto& name : shipped_policy_names()) {
    const Policy policy = load_policy(name);
    EXPECT_TRUE(unsupported_fields(policy, {}).empty()) << name;
  }
}

TEST(DockerContainerSpec, RefusesWhatDockerCannotHonourNamingTheField) {
  Policy policy = load_policy("default");
  policy.namespaces.mount = false;
  policy.capabilities = {"CAP_NET_BIND_SERVICE"};
  auto problems = unsupported_fields(policy, {});
  EXPECT_EQ(paths_of(problems), (std::vector<std::string>{"namespaces.mount", "capabilities"}));
  try {
    require_supported(policy, {});
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("namespaces.mount: false cannot be honoured"), std::string::npos)
        << message;
    EXPECT_NE(message.find("capabilities: Docker gives added capabilities to uid 0 only"),
              std::string::npos)
        << message;
  }
}

TEST(DockerContainerSpec, RootNeedsAUserNamespaceOrAnExplicitOptOut) {
  Policy policy = load_policy("default");
  policy.user = {0, 0};
  EXPECT_EQ(paths_of(unsupported_fields(policy, {})), std::vector<std::string>{"user.uid"});
  EXPECT_TRUE(unsupported_fields(policy, DaemonTraits{.remaps_users = true}).empty());
  policy.namespaces.user = false;
  policy.capabilities = {"CAP_NET_BIND_SERVICE"};
  EXPECT_TRUE(unsupported_fields(policy, {}).empty()) << "root may keep capabilities";
  const auto body = create_body(policy, plan_for({"true"}));
  EXPECT_EQ(body["HostConfig"]["CapAdd"], nlohmann::json({"CAP_NET_BIND_SERVICE"}));
  EXPECT_EQ(body["HostConfig"]["UsernsMode"], "host");
  EXPECT_EQ(body["User"], "0:0");
}

TEST(DockerOwnership, AnOwnerThatIsGoneIsDeadAndOneFromAnotherBootToo) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  // Its id must name it while it lives; a zombie still has its /proc entry.
  const std::string own = new_owned_id();
  const std::string pid_ns = own.substr(own.find('-', own.find('-') + 1) + 1);
  int status = 0;
  waitpid(child, &status, 0);
  const std::string gone = std::to_string(child) + "-1-" + pid_ns;
  EXPECT_EQ(owner_state(gone, boot_id()), OwnerState::dead);
  EXPECT_EQ(owner_state(own, "another-boot"), OwnerState::dead);
  EXPECT_EQ(owner_state(own, boot_id()), OwnerState::alive);
  EXPECT_EQ(owner_state("not-a-run-id", boot_id()), OwnerState::unknown);
  EXPECT_EQ(owner_state(own, ""), OwnerState::unknown);
}

}  // namespace
}  // namespace rlm::docker
