// `rlm-sandbox health` end to end.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "cli_test_util.hpp"
#include "support/lane.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

TEST(CliHealth, JsonListsEveryBackendWithWhatItEnforces) {
  auto out = cli({"health", "--json"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  auto report = json::parse(out.out);
  ASSERT_EQ(report["backends"].size(), 4u);
  std::vector<std::string> names;
  for (const auto& backend : report["backends"]) {
    names.push_back(backend["backend"]);
    for (const char* key :
         {"available", "isolated", "detail", "fix", "enforced", "unenforced", "network"})
      EXPECT_TRUE(backend.contains(key)) << key;
    // The network modes each enforces: an allowlist on the namespace backend, and on the docker
    // backend when its daemon answers and this runs as root (it joins a container's network
    // namespace); never on landlock or local (docs/network.md).
    const auto modes = backend["network"].dump();
    const bool allowlist =
        backend["backend"] == "namespace" ||
        (backend["backend"] == "docker" && backend["available"] == true && geteuid() == 0);
    EXPECT_EQ(modes.find("allowlist") != std::string::npos, allowlist)
        << backend["backend"] << ": " << modes;
    if (backend["backend"] == "local") {
      EXPECT_EQ(backend["available"], true);
      EXPECT_EQ(backend["isolated"], false);
      auto enforced = backend["enforced"].dump();
      EXPECT_NE(enforced.find("limits.wall_time_ms"), std::string::npos) << enforced;
      auto unenforced = backend["unenforced"].dump();
      EXPECT_NE(unenforced.find("limits.pids"), std::string::npos) << unenforced;
      EXPECT_NE(unenforced.find("namespaces"), std::string::npos) << unenforced;
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"namespace", "docker", "landlock", "local"}));
}

bool lists(const json& array, const std::string& item) {
  return std::find(array.begin(), array.end(), item) != array.end();
}

// The setup this host is (tests/lanes/run-lane says which lane it runs in), with what it
// enforces, what stands in, where groups go and what fixes the rest.
TEST(CliHealth, TheNamespaceBackendNamesThisHostsSetup) {
  const std::string lane = test_lane();
  auto out = cli({"health", "--json"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  json ns = json::parse(out.out)["backends"][0];
  ASSERT_EQ(ns["backend"], "namespace");
  ASSERT_EQ(ns["available"], true) << ns.dump(2);
  const json& host = ns["host"];
  EXPECT_EQ(host["setup"], lane) << ns.dump(2);
  EXPECT_EQ(host["runtime_uid"], ::geteuid());
  const json parents = host["cgroup_parents"];

  if (lane == "user-no-cgroup") {
    EXPECT_EQ(host["cgroup"], "none");
    EXPECT_EQ(parents, json::array());
    // Without a cgroup nothing counts the sandbox's processes together: CPU time falls back to
    // RLIMIT_CPU per process, and there is no CPU bandwidth (issue 11 line 15).
    EXPECT_EQ(ns["unenforced"],
              json::array({"limits.memory_bytes", "limits.cpu_time_ms", "limits.cpus"}))
        << ns.dump(2);
    EXPECT_TRUE(lists(ns["enforced"], "limits.pids")) << "RLIMIT_NPROC per user namespace";
    EXPECT_NE(ns["fallbacks"].value("limits.memory_bytes", "").find("RLIMIT_AS"),
              std::string::npos);
    EXPECT_NE(ns["fallbacks"].value("limits.pids", "").find("RLIMIT_NPROC"), std::string::npos);
    EXPECT_NE(ns["fallbacks"].value("limits.cpu_time_ms", "").find("RLIMIT_CPU per process"),
              std::string::npos);
    // The fix names the way to a cgroup this user can have.
    const std::string fix = ns["fix"];
    EXPECT_NE(fix.find(cgroup2_mounted() ? "systemd-run --user" : "run rlm-sandbox as root"),
              std::string::npos)
        << fix;
  } else {
    EXPECT_EQ(ns["unenforced"], json::array()) << ns.dump(2);
    EXPECT_EQ(ns["fallbacks"], json::object()) << ns.dump(2);
    EXPECT_EQ(ns["fix"], "");
    EXPECT_TRUE(lists(ns["enforced"], "limits.memory_bytes"));
    EXPECT_TRUE(lists(ns["enforced"], "limits.pids"));
    // The run's cgroup counts the sandbox's CPU time and holds its bandwidth (issue 11 line 15).
    EXPECT_TRUE(lists(ns["enforced"], "limits.cpu_time_ms")) << ns.dump(2);
    EXPECT_TRUE(lists(ns["enforced"], "limits.cpus")) << ns.dump(2);
    ASSERT_FALSE(parents.empty()) << ns.dump(2);
    for (const auto& parent : parents) {
      const std::string dir = parent;
      EXPECT_TRUE(dir.starts_with("/sys/fs/cgroup/") && dir.ends_with("/rlm-sandbox")) << dir;
    }
  }
  if (lane == "root-cgroup-v1") {
    EXPECT_EQ(host["cgroup"], "v1");
    EXPECT_GE(parents.size(), 2u) << "memory and pids hierarchies at least";
  } else if (lane == "root-cgroup-v2") {
    EXPECT_EQ(host["cgroup"], "v2");
    EXPECT_EQ(parents, json::array({"/sys/fs/cgroup/rlm-sandbox"}));
  } else if (lane == "user-delegated-cgroup-v2") {
    EXPECT_EQ(host["cgroup"], "v2");
    const char* scope = std::getenv("RLM_TEST_DELEGATED_CGROUP");
    ASSERT_NE(scope, nullptr) << "tests/lanes/run-lane names the delegated scope";
    EXPECT_EQ(parents, json::array({std::string(scope) + "/rlm-sandbox"}));
  }

  auto text = cli({"health"});
  EXPECT_NE(text.out.find("host setup: " + lane), std::string::npos) << text.out;
}

// Inside a container without a writable cgroupfs: made here with a mount namespace of the test's
// own in which every cgroup mount is remounted read-only (the host's mounts stay as they are).
TEST(CliHealth, AReadOnlyCgroupFilesystemIsExplained) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace of its own";
  const std::string script =
      "mount --make-rprivate / && for d in /sys/fs/cgroup /sys/fs/cgroup/*; do "
      "if mountpoint -q \"$d\"; then mount -o remount,bind,ro \"$d\" || exit 3; fi; done; "
      "exec \"$0\" health --json";
  auto out = run_process(
      {"/usr/bin/unshare", "--mount", "/bin/sh", "-c", script, bin_path("rlm-sandbox")});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  json ns = json::parse(out.out)["backends"][0];
  EXPECT_EQ(ns["available"], true) << "the sandbox still runs, on rlimits";
  EXPECT_EQ(ns["host"]["setup"], "root-no-cgroup") << ns.dump(2);
  EXPECT_NE(ns["detail"].get<std::string>().find("mounted read-only"), std::string::npos)
      << ns["detail"];
  const std::string fix = ns["fix"];
  EXPECT_NE(fix.find("--privileged"), std::string::npos) << fix;
  EXPECT_TRUE(lists(ns["unenforced"], "limits.memory_bytes"));
  EXPECT_TRUE(lists(ns["unenforced"], "limits.cpu_time_ms"));
  EXPECT_TRUE(lists(ns["unenforced"], "limits.cpus"));
  // The host's own cgroup mounts were not touched.
  EXPECT_EQ(cli({"health", "--json"}).out.find("\"root-no-cgroup\""), std::string::npos);
}

// Where user namespaces are switched off (user.max_user_namespaces=0, as some distributions and
// hardening guides ship), health says so and gives the sysctl. Made here in a user namespace of
// the test's own, whose limit its owner may set without touching the host's.
TEST(CliHealth, UserNamespacesSwitchedOffAreExplained) {
  const std::string script =
      "echo 0 > /proc/sys/user/max_user_namespaces || exit 3; exec \"$0\" health --json";
  auto out = run_process({"/usr/bin/unshare", "--user", "--map-root-user", "/bin/sh", "-c", script,
                          bin_path("rlm-sandbox")});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  json ns = json::parse(out.out)["backends"][0];
  EXPECT_EQ(ns["available"], false) << ns.dump(2);
  EXPECT_EQ(ns["fix"], "sysctl -w user.max_user_namespaces=15000") << ns.dump(2);
  // And a run that asks for the namespace backend fails closed, naming the fix.
  auto run = run_process(
      {"/usr/bin/unshare", "--user", "--map-root-user", "/bin/sh", "-c",
       "echo 0 > /proc/sys/user/max_user_namespaces; exec \"$0\" run --backend namespace -- true",
       bin_path("rlm-sandbox")});
  EXPECT_EQ(run.exit_code, 125) << run.err;
  EXPECT_NE(run.err.find("user.max_user_namespaces"), std::string::npos) << run.err;
}

TEST(CliHealth, PolicySelectionIsReported) {
  auto local = cli({"health", "--json", "--policy", "trusted-local"});
  EXPECT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(json::parse(local.out)["selection"]["backend"], "local");
}

TEST(CliHealth, TextFormIsReadable) {
  auto out = cli({"doctor"});
  EXPECT_EQ(out.exit_code, 0);
  EXPECT_NE(out.out.find("local: available (no isolation)"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("does not enforce"), std::string::npos) << out.out;
}

}  // namespace
}  // namespace rlm::test
