// "extends", name lookup and file loading.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "policy_test_helpers.hpp"
#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm {
namespace {

using test::only_problem_in;
using test::problems_in;
using test::ScopedEnv;
using test::TempDir;
using ::testing::HasSubstr;

TEST(PolicyExtends, ByShippedName) {
  const Policy policy =
      load_policy_text(R"({"extends": "strict", "limits": {"pids": 8}})", "mine.json");
  const Policy strict = load_policy("strict");
  EXPECT_EQ(policy.limits.pids, 8u);
  EXPECT_EQ(policy.limits.memory_bytes, strict.limits.memory_bytes) << "inherited from strict";
  EXPECT_EQ(policy.backend.prefer, strict.backend.prefer);
  EXPECT_EQ(policy.filesystem.mounts.size(), strict.filesystem.mounts.size())
      << "inherited from default through strict";
  EXPECT_EQ(policy.name, "mine.json");
}

TEST(PolicyExtends, ObjectsMergeKeyByKey) {
  const Policy policy = load_policy_text(
      R"({"extends": "default", "env": {"set": {"EXTRA": "1", "HOME": "/home/sandbox"}}})", "m");
  EXPECT_EQ(policy.env.set.at("EXTRA"), "1");
  EXPECT_EQ(policy.env.set.at("HOME"), "/home/sandbox") << "overridden";
  EXPECT_EQ(policy.env.set.at("PATH"), "/usr/local/bin:/usr/bin:/bin") << "kept from default";
  EXPECT_TRUE(policy.env.clear) << "sibling key kept from default";
}

TEST(PolicyExtends, ArraysReplace) {
  const Policy policy = load_policy_text(R"({"extends": "default",
      "filesystem": {"mounts": [{"target": "/tmp", "type": "tmpfs"}]}})",
                                         "m");
  ASSERT_EQ(policy.filesystem.mounts.size(), 1u);
  EXPECT_EQ(policy.filesystem.mounts[0].target, "/tmp");
  EXPECT_EQ(policy.filesystem.workdir, "/tmp") << "sibling key kept from default";
}

// filesystem.add_mounts adds to the base's mounts instead of replacing them, level by level:
// before, a policy that wanted one more bind had to repeat the base's whole list.
TEST(PolicyExtends, AddMountsAppendsToTheBasesMountsAtEachLevel) {
  TempDir dir;
  dir.write("data.json", R"({"extends": "default",
      "filesystem": {"add_mounts": [{"source": "/usr/share", "target": "/data"}]}})");
  dir.write("scratch.json", R"({"extends": "./data.json",
      "filesystem": {"add_mounts": [{"type": "tmpfs", "target": "/scratch"}]}})");
  const Policy base = load_policy("default");
  const Policy policy = load_policy(dir.file("scratch.json"));
  ASSERT_EQ(policy.filesystem.mounts.size(), base.filesystem.mounts.size() + 2);
  for (std::size_t i = 0; i < base.filesystem.mounts.size(); ++i)
    EXPECT_EQ(policy.filesystem.mounts[i].target, base.filesystem.mounts[i].target);
  EXPECT_EQ(policy.filesystem.mounts[base.filesystem.mounts.size()].target, "/data");
  EXPECT_EQ(policy.filesystem.mounts.back().target, "/scratch");
  // The resolved policy has no add_mounts: `policy show` is the whole list.
  EXPECT_FALSE(policy.to_json()["filesystem"].contains("add_mounts"));

  // mounts still replaces, and add_mounts goes after the replacement.
  const Policy replaced = load_policy_text(R"({"extends": "default", "filesystem": {
      "mounts": [{"target": "/tmp", "type": "tmpfs"}],
      "add_mounts": [{"target": "/more", "type": "tmpfs"}]}})",
                                           "m");
  ASSERT_EQ(replaced.filesystem.mounts.size(), 2u);
  EXPECT_EQ(replaced.filesystem.mounts[1].target, "/more");

  // Anything but an array is refused at its path.
  try {
    load_policy_text(R"({"extends": "default", "filesystem": {"add_mounts": {}}})", "m");
    ADD_FAILURE() << "an object as add_mounts was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("filesystem.add_mounts: expected an array"),
              std::string::npos)
        << error.what();
  }
}

TEST(PolicyExtends, ByRelativePathFromTheIncludingFile) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("base/nested"));
  dir.write("base/nested/root.json", R"({"extends": "default", "hostname": "root-host"})");
  dir.write("base/middle.json",
            R"({"extends": "nested/root.json", "limits": {"memory_bytes": "64M"}})");
  dir.write("top.json", R"({"extends": "./base/middle.json", "limits": {"pids": 4}})");

  const Policy policy = load_policy(dir.file("top.json"));
  EXPECT_EQ(policy.name, dir.file("top.json"));
  EXPECT_EQ(policy.limits.pids, 4u);
  EXPECT_EQ(policy.limits.memory_bytes, 64u << 20);
  EXPECT_EQ(policy.hostname, "root-host");
  EXPECT_EQ(policy.filesystem.workdir, "/tmp") << "from default at the bottom of the chain";

  // load_policy_text resolves relative paths against its base_dir.
  const Policy from_text =
      load_policy_text(R"({"extends": "base/middle.json"})", "inline", dir.path());
  EXPECT_EQ(from_text.hostname, "root-host");
}

TEST(PolicyExtends, MissingFileSaysWhy) {
  TempDir dir;
  const auto d = test::only_problem_in(R"({"extends": "./nope.json"})");
  EXPECT_EQ(d.path, "extends");
  EXPECT_EQ(d.message, "cannot read policy file './nope.json': No such file or directory");

  const auto found = check_policy(dir.file("absent.json"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, "");
  EXPECT_THAT(found[0].message, HasSubstr("No such file or directory"));
  EXPECT_THAT(check_policy(dir.path() + "/").at(0).message, HasSubstr("Is a directory"));
}

TEST(PolicyExtends, ProblemsInABaseNameTheirFile) {
  TempDir dir;
  dir.write("broken.json", "{\n  \"limits\": {,\n}");
  dir.write("bad-value.json", R"({"limits": {"pids": 0}})");
  dir.write("top.json", R"({"extends": "broken.json", "hostname": "bad host"})");

  const auto found = check_policy(dir.file("top.json"));
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].path, "extends");
  EXPECT_EQ(found[0].message, "in " + dir.file("broken.json") +
                                  ": malformed JSON at line 2, column 14: unexpected ','; "
                                  "expected string literal");
  EXPECT_EQ(found[1].path, "hostname") << "the document itself is still checked";

  // A bad value from a base is reported at its path in the merged document.
  dir.write("top2.json", R"({"extends": "bad-value.json"})");
  const auto merged = check_policy(dir.file("top2.json"));
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].path, "limits.pids");
}

TEST(PolicyExtends, CyclesAreDetected) {
  TempDir dir;
  dir.write("a.json", R"({"extends": "b.json"})");
  dir.write("b.json", R"({"extends": "./a.json"})");
  const auto found = check_policy(dir.file("a.json"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, "extends");
  EXPECT_THAT(found[0].message, HasSubstr("cycle: "));
  EXPECT_THAT(found[0].message, HasSubstr(dir.file("a.json") + " -> " + dir.file("b.json") +
                                          " -> " + dir.file("a.json")));

  dir.write("self.json", R"({"extends": "self.json"})");
  EXPECT_THAT(check_policy(dir.file("self.json")).at(0).message, HasSubstr("cycle"));
}

TEST(PolicyExtends, DepthIsLimited) {
  TempDir dir;
  // p0 extends p1 ... extends p17: 17 levels.
  for (int i = 0; i < 17; ++i)
    dir.write("p" + std::to_string(i) + ".json",
              R"({"extends": "p)" + std::to_string(i + 1) + R"(.json"})");
  dir.write("p17.json", "{}");
  const auto found = check_policy(dir.file("p0.json"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_THAT(found[0].message, HasSubstr("more than 16 levels of extends"));
  // 16 levels are fine.
  EXPECT_TRUE(check_policy(dir.file("p1.json")).empty());
}

TEST(PolicyExtends, UnknownNameSuggestsAndListsShippedPolicies) {
  const auto d = only_problem_in(R"({"extends": "stric"})");
  EXPECT_EQ(d.path, "extends");
  EXPECT_THAT(d.message, HasSubstr("unknown policy 'stric'; did you mean strict?"));
  EXPECT_THAT(
      d.message,
      HasSubstr("; shipped policies: ci, default, landlock, python-repl, strict, trusted-local;"));

  try {
    load_policy("defualt");
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& error) {
    EXPECT_EQ(error.origin(), "defualt");
    EXPECT_THAT(error.what(), HasSubstr("did you mean default?"));
  }
}

TEST(PolicyExtends, ExtendsMustBeAString) {
  EXPECT_EQ(only_problem_in(R"({"extends": ["default"]})").to_string(),
            "extends: expected a policy name or file path, got an array");
}

TEST(PolicyExtends, SearchPathComesBeforeShippedPolicies) {
  TempDir first, second;
  second.write("strict.json", R"({"extends": "default", "hostname": "from-second"})");
  second.write("team.json", R"({"extends": "strict", "limits": {"pids": 3}})");
  first.write("team.json", R"({"extends": "strict", "limits": {"pids": 2}})");
  ScopedEnv path("RLM_SANDBOX_POLICY_PATH", first.path() + "::" + second.path());

  const Policy team = load_policy("team");
  EXPECT_EQ(team.name, "team");
  EXPECT_EQ(team.limits.pids, 2u) << "the first directory wins";
  EXPECT_EQ(team.hostname, "from-second") << "its extends \"strict\" also searches the path";

  const Policy strict = load_policy("strict");
  EXPECT_EQ(strict.hostname, "from-second") << "a file on the path shadows a shipped policy";

  EXPECT_THAT(check_policy("teem").at(0).message, HasSubstr("did you mean team?"));
}

TEST(PolicyExtends, ShippedPoliciesLoadWithoutTheSourceTree) {
  ScopedEnv path("RLM_SANDBOX_POLICY_PATH", "/nonexistent");
  TempDir elsewhere;
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(elsewhere.path());
  EXPECT_NO_THROW(load_policy("python-repl"));
  std::filesystem::current_path(old);
}

TEST(PolicyExtends, ArgumentIsAPathWhenItLooksLikeOne) {
  TempDir dir;
  dir.write("default", R"({"hostname": "a-file-named-default"})");
  dir.write("plain.json", R"({"hostname": "plain"})");
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  EXPECT_EQ(load_policy("default").hostname, "a-file-named-default") << "an existing file";
  EXPECT_EQ(load_policy("plain.json").hostname, "plain") << "ends in .json";
  EXPECT_EQ(load_policy("./plain.json").hostname, "plain") << "contains '/'";
  EXPECT_EQ(load_policy("strict").hostname, "sandbox")
      << "a shipped name; and its own extends \"default\" is never the file in this directory";
  std::filesystem::current_path(old);
}

TEST(PolicyExtends, CheckPolicyReturnsEveryDiagnostic) {
  TempDir dir;
  dir.write("three.json", R"({"limits": {"pids": 0, "memroy_bytes": 1}, "network": "wifi"})");
  const auto found = check_policy(dir.file("three.json"));
  ASSERT_EQ(found.size(), 3u);
  EXPECT_TRUE(check_policy("default").empty());
}

}  // namespace
}  // namespace rlm
