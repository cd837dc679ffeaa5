// The policies in policies/: embedded, valid, round-tripping, and saying what they promise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::vector<std::string> policy_files_in_source_tree() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("policies")))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ShippedPolicies, NamesMatchTheFilesInPolicies) {
  EXPECT_EQ(shipped_policy_names(), policy_files_in_source_tree());
  EXPECT_EQ(shipped_policy_names(),
            (std::vector<std::string>{"ci", "default", "landlock", "python-repl", "strict",
                                      "trusted-local"}));
}

TEST(ShippedPolicies, EmbeddedTextMatchesTheSourceFiles) {
  // Loading by path and by name must give the same policy: the embedding is current.
  for (const auto& name : shipped_policy_names()) {
    SCOPED_TRACE(name);
    const auto by_name = load_policy(name).to_json();
    const auto by_path = load_policy(test::source_path("policies/" + name + ".json")).to_json();
    EXPECT_EQ(by_name, by_path);
  }
}

TEST(ShippedPolicies, EveryOneValidatesAndHasADescription) {
  for (const auto& name : shipped_policy_names()) {
    SCOPED_TRACE(name);
    const auto problems = check_policy(name);
    for (const auto& d : problems) ADD_FAILURE() << d.to_string();
    const Policy policy = load_policy(name);
    EXPECT_EQ(policy.name, name);
    EXPECT_FALSE(policy.description.empty());
  }
}

TEST(ShippedPolicies, ToJsonRoundTrips) {
  for (const auto& name : shipped_policy_names()) {
    SCOPED_TRACE(name);
    const auto document = load_policy(name).to_json();
    EXPECT_FALSE(document.contains("extends"));
    const auto again = policy_from_json(document, name).to_json();
    EXPECT_EQ(again, document) << document.dump(2) << "\n---\n" << again.dump(2);
    // And through text, as `policy show > file; --policy file` would.
    EXPECT_EQ(load_policy_text(document.dump(2), "shown.json").to_json(), document);
  }
}

TEST(ShippedPolicies, ToJsonIsExplicitAndCanonical) {
  const auto document = load_policy("default").to_json();
  EXPECT_EQ(document["limits"]["memory_bytes"], 256u << 20);
  EXPECT_EQ(document["limits"]["wall_time_ms"], 10'000);
  EXPECT_EQ(document["limits"]["kill_grace_ms"], 200);
  EXPECT_EQ(document["limits"]["session_buffer_bytes"], 24u << 20);
  EXPECT_EQ(document["network"], "none");
  EXPECT_EQ(document["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
  EXPECT_TRUE(document["seccomp"]["syscalls"].is_array());
  EXPECT_TRUE(document["capabilities"].is_array());
  EXPECT_TRUE(document["env"]["pass"].is_array());
  const auto& tmp = document["filesystem"]["mounts"].back();
  EXPECT_EQ(tmp["type"], "tmpfs");
  EXPECT_EQ(tmp["size"], 64u << 20) << "the effective size is shown";
  EXPECT_FALSE(tmp.contains("source"));
  const auto& usr = document["filesystem"]["mounts"].front();
  EXPECT_EQ(usr["source"], "/usr");
  EXPECT_EQ(usr["optional"], false);
  for (const char* key : {"description", "backend", "limits", "namespaces", "filesystem", "network",
                          "seccomp", "capabilities", "env", "user", "hostname", "docker"})
    EXPECT_TRUE(document.contains(key)) << key;

  const auto strict = load_policy("strict").to_json();
  EXPECT_EQ(strict["seccomp"]["syscalls"][0]["errnoRet"], 1);
  EXPECT_EQ(strict["seccomp"]["syscalls"][0]["action"], "SCMP_ACT_ERRNO");
}

TEST(ShippedPolicies, DefaultIsWhatTheDocsSay) {
  const Policy policy = load_policy("default");
  EXPECT_EQ(policy.backend.prefer, (std::vector<std::string>{"namespace", "docker"}));
  EXPECT_FALSE(policy.backend.allow_unisolated);
  EXPECT_EQ(policy.limits.wall_time, milliseconds(10'000));
  EXPECT_EQ(policy.limits.cpu_time, milliseconds(10'000));
  EXPECT_EQ(policy.limits.memory_bytes, 256u << 20);
  EXPECT_EQ(policy.limits.pids, 64u);
  EXPECT_EQ(policy.limits.output_bytes, 1u << 20);
  EXPECT_EQ(policy.limits.file_size_bytes, 16u << 20);
  EXPECT_EQ(policy.limits.open_files, 256u);
  EXPECT_EQ(policy.limits.tmpfs_bytes, 64u << 20);
  EXPECT_EQ(policy.limits.kill_grace, milliseconds(200));
  EXPECT_EQ(policy.network, Network::none);
  EXPECT_TRUE(policy.namespaces.user && policy.namespaces.pid && policy.namespaces.net &&
              policy.namespaces.mount && policy.namespaces.ipc && policy.namespaces.uts &&
              policy.namespaces.cgroup);
  ASSERT_FALSE(policy.filesystem.mounts.empty());
  for (const auto& mount : policy.filesystem.mounts) {
    SCOPED_TRACE(mount.target);
    if (mount.type == Mount::Type::bind) {
      EXPECT_TRUE(mount.readonly) << "every bind in default is read-only";
      EXPECT_EQ(mount.optional, mount.target != "/usr");
    }
  }
  EXPECT_EQ(policy.filesystem.mounts.back().type, Mount::Type::tmpfs);
  EXPECT_EQ(policy.filesystem.mounts.back().target, "/tmp");
  EXPECT_EQ(policy.filesystem.workdir, "/tmp");
  EXPECT_TRUE(policy.seccomp.syscalls.empty());
  EXPECT_TRUE(policy.capabilities.empty());
  EXPECT_TRUE(policy.env.clear);
  EXPECT_EQ(policy.env.set,
            (std::map<std::string, std::string>{
                {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"}}));
  EXPECT_EQ(policy.user.uid, 1000u);
  EXPECT_EQ(policy.user.gid, 1000u);
  EXPECT_EQ(policy.hostname, "sandbox");
  EXPECT_EQ(policy.docker.image, "python:3.12-slim");
}

TEST(ShippedPolicies, StrictIsTighterThanDefaultEverywhere) {
  const Policy base = load_policy("default");
  const Policy strict = load_policy("strict");
  EXPECT_EQ(strict.backend.prefer, std::vector<std::string>{"namespace"});
  EXPECT_LT(strict.limits.wall_time, base.limits.wall_time);
  EXPECT_LT(strict.limits.cpu_time, base.limits.cpu_time);
  EXPECT_EQ(strict.limits.memory_bytes, 128u << 20);
  EXPECT_EQ(strict.limits.pids, 16u);
  EXPECT_EQ(strict.limits.output_bytes, 256u << 10);
  EXPECT_EQ(strict.limits.file_size_bytes, 1u << 20);
  EXPECT_EQ(strict.limits.open_files, 64u);
  EXPECT_EQ(strict.limits.tmpfs_bytes, 16u << 20);
  ASSERT_EQ(strict.seccomp.syscalls.size(), 1u);
  const auto& names = strict.seccomp.syscalls[0].names;
  for (const char* denied : {"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "syslog",
                             "reboot", "open_by_handle_at", "chroot", "vmsplice"})
    EXPECT_NE(std::find(names.begin(), names.end(), denied), names.end()) << denied;
  EXPECT_EQ(strict.seccomp.syscalls[0].errno_ret, 1);
}

TEST(ShippedPolicies, PythonReplKeepsDefaultEnvironment) {
  const Policy policy = load_policy("python-repl");
  EXPECT_EQ(policy.limits.wall_time, milliseconds(60'000));
  EXPECT_EQ(policy.limits.cpu_time, milliseconds(60'000));
  EXPECT_EQ(policy.limits.memory_bytes, 512u << 20);
  EXPECT_EQ(policy.limits.output_bytes, 4u << 20);
  EXPECT_EQ(policy.limits.pids, 64u) << "inherited";
  EXPECT_EQ(policy.env.set.at("PYTHONUNBUFFERED"), "1");
  EXPECT_EQ(policy.env.set.at("PYTHONDONTWRITEBYTECODE"), "1");
  EXPECT_EQ(policy.env.set.at("PATH"), "/usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(policy.env.set.at("HOME"), "/tmp");
}

TEST(ShippedPolicies, CiHasRoomForBuilds) {
  const Policy policy = load_policy("ci");
  EXPECT_EQ(policy.limits.wall_time, std::chrono::minutes(30));
  EXPECT_EQ(policy.limits.cpu_time, std::chrono::minutes(30));
  EXPECT_EQ(policy.limits.memory_bytes, 4ull << 30);
  EXPECT_EQ(policy.limits.pids, 1024u);
  EXPECT_EQ(policy.limits.output_bytes, 16u << 20);
  EXPECT_EQ(policy.limits.file_size_bytes, 1ull << 30);
  EXPECT_EQ(policy.limits.open_files, 4096u);
  EXPECT_EQ(policy.limits.tmpfs_bytes, 2ull << 30);
}

TEST(ShippedPolicies, OnlyTrustedLocalAllowsUnisolatedRuns) {
  for (const auto& name : shipped_policy_names())
    EXPECT_EQ(load_policy(name).backend.allow_unisolated, name == "trusted-local") << name;
  const Policy policy = load_policy("trusted-local");
  EXPECT_EQ(policy.backend.prefer, std::vector<std::string>{"local"});
  EXPECT_EQ(policy.filesystem.workdir, "");
  EXPECT_EQ(policy.env.pass, (std::vector<std::string>{"HOME", "USER", "LANG", "TERM", "TMPDIR"}));
  EXPECT_EQ(policy.env.set.at("PATH"),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  EXPECT_THAT(policy.description, HasSubstr("NO ISOLATION"));
}

}  // namespace
}  // namespace rlm
