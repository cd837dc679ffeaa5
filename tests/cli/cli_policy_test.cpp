// `rlm-sandbox policy check|show|list` end to end.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

std::vector<std::string> shipped_files() {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(source_path("policies")))
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  return files;
}

TEST(CliPolicy, CheckPassesEveryShippedPolicyByNameAndByFile) {
  auto files = shipped_files();
  ASSERT_GE(files.size(), 5u);
  std::vector<std::string> args = {"policy", "check"};
  args.insert(args.end(), files.begin(), files.end());
  for (const char* name : {"default", "strict", "python-repl", "ci", "trusted-local"})
    args.push_back(name);
  auto out = cli(args);
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.err, "");
}

TEST(CliPolicy, CheckReportsEveryMistakeWithItsPath) {
  TempDir dir;
  dir.write("three.json", R"({
    "extends": "default",
    "limits": {"memroy_bytes": "64M", "pids": 0},
    "network": "internet"
  })");
  auto out = cli({"policy", "check", dir.file("three.json")});
  EXPECT_EQ(out.exit_code, 1);
  int lines = 0;
  for (char c : out.err) lines += c == '\n';
  EXPECT_EQ(lines, 4) << out.err;  // three problems and the count
  EXPECT_NE(out.err.find("limits.memroy_bytes"), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("did you mean memory_bytes"), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("limits.pids"), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("network"), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("3 problems found"), std::string::npos) << out.err;
}

TEST(CliPolicy, ShowPrintsTheEffectivePolicyAfterExtends) {
  TempDir dir;
  dir.write("mine.json", R"({"extends": "strict", "limits": {"memory_bytes": "32M"}})");
  auto out = cli({"policy", "show", dir.file("mine.json")});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  auto policy = json::parse(out.out);
  EXPECT_EQ(policy["limits"]["memory_bytes"], 32u << 20);
  EXPECT_EQ(policy["limits"]["pids"], 16) << "inherited from strict";
  EXPECT_FALSE(policy.contains("extends"));
  EXPECT_EQ(policy["network"], "none");
}

TEST(CliPolicy, ExportsADockerSeccompProfileWithThePreamble) {
  auto out = cli({"policy", "export", "--docker-seccomp", "strict"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  auto profile = json::parse(out.out);
  EXPECT_EQ(profile["defaultAction"], "SCMP_ACT_ALLOW");
  std::string denied;
  for (const auto& rule : profile["syscalls"])
    if (rule["action"] != "SCMP_ACT_ALLOW")
      for (const auto& name : rule["names"]) denied += name.get<std::string>() + " ";
  for (const char* name : {"unshare", "mount", "bpf", "keyctl", "ptrace", "clone3"})
    EXPECT_NE(denied.find(std::string(name) + " "), std::string::npos) << name << " in " << denied;

  EXPECT_EQ(cli({"policy", "export", "strict"}).exit_code, 2) << "the format is required";
}

TEST(CliPolicy, CheckRejectsRulesThatWouldWeakenThePreamble) {
  TempDir dir;
  dir.write("weak.json", R"({"extends": "default", "seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_ALLOW"}]}})");
  auto out = cli({"policy", "check", dir.file("weak.json")});
  EXPECT_EQ(out.exit_code, 1);
  EXPECT_NE(out.err.find("seccomp.syscalls[0]"), std::string::npos) << out.err;
}

TEST(CliPolicy, ListNamesTheShippedPolicies) {
  auto out = cli({"policy", "list"});
  EXPECT_EQ(out.exit_code, 0);
  EXPECT_EQ(out.out, "ci\ndefault\nlandlock\npython-repl\nstrict\ntrusted-local\n");
}

TEST(CliPolicy, BadInvocationsAreUsageErrors) {
  EXPECT_EQ(cli({"policy"}).exit_code, 2);
  EXPECT_EQ(cli({"policy", "check"}).exit_code, 2);
  EXPECT_EQ(cli({"policy", "explode", "default"}).exit_code, 2);
  auto missing = cli({"policy", "show", "/no/such/policy.json"});
  EXPECT_EQ(missing.exit_code, 125);
  EXPECT_NE(missing.err.find("/no/such/policy.json"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace rlm::test
