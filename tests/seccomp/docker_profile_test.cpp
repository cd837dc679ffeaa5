// The Docker profile export: its shape, the preamble inside it, and that it says what compile()
// enforces.
#include <sys/ioctl.h>

#include <cerrno>

#include <gmock/gmock.h>

#include "seccomp_test_util.hpp"

namespace rlm::seccomp::test {
namespace {

using nlohmann::json;

// The entries naming `name`.
std::vector<json> entries_for(const json& profile, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : profile["syscalls"])
    for (const auto& n : e["names"])
      if (n == name) out.push_back(e);
  return out;
}

// A profile read back as a policy's seccomp block, the way the policy loader reads one.
Seccomp from_profile(const json& profile) {
  Seccomp s;
  s.default_action = profile["defaultAction"];
  for (const auto& e : profile["syscalls"]) {
    SeccompRule r;
    r.names = e["names"].get<std::vector<std::string>>();
    r.action = e["action"];
    if (e.contains("errnoRet")) r.errno_ret = e["errnoRet"].get<int>();
    for (const auto& a : e["args"])
      r.args.push_back(arg(a["index"], a["op"], a["value"], a["valueTwo"]));
    s.syscalls.push_back(std::move(r));
  }
  return s;
}

TEST(SeccompDockerProfile, HasDockersShape) {
  const json profile =
      docker_profile(policy("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 5)}));
  EXPECT_EQ(profile["defaultAction"], "SCMP_ACT_ALLOW");
#if defined(__x86_64__)
  EXPECT_EQ(profile["architectures"], json::array({"SCMP_ARCH_X86_64"}));
#elif defined(__aarch64__)
  EXPECT_EQ(profile["architectures"], json::array({"SCMP_ARCH_AARCH64"}));
#endif
  ASSERT_TRUE(profile["syscalls"].is_array());
  for (const auto& e : profile["syscalls"]) {
    ASSERT_TRUE(e["names"].is_array() && !e["names"].empty()) << e;
    ASSERT_TRUE(e["action"].is_string()) << e;
    EXPECT_EQ(e.contains("errnoRet"), e["action"] == "SCMP_ACT_ERRNO") << e;
    ASSERT_TRUE(e["args"].is_array()) << e;
    for (const auto& a : e["args"]) {
      EXPECT_TRUE(a["index"].is_number_unsigned()) << a;
      EXPECT_TRUE(a["value"].is_number_unsigned()) << a;
      EXPECT_TRUE(a["valueTwo"].is_number_unsigned()) << a;
      EXPECT_TRUE(a["op"].is_string()) << a;
    }
  }
  // The policy's rule comes after the preamble.
  EXPECT_EQ(profile["syscalls"].back(), (json{{"names", {"uname"}},
                                              {"action", "SCMP_ACT_ERRNO"},
                                              {"errnoRet", 5},
                                              {"args", json::array()}}));
}

TEST(SeccompDockerProfile, ContainsThePreamble) {
  const json profile = docker_profile(policy("SCMP_ACT_ALLOW"));
  // The argument-less EPERM denials share one entry.
  const auto mount = entries_for(profile, "mount");
  ASSERT_EQ(mount.size(), 1u);
  EXPECT_EQ(mount[0]["action"], "SCMP_ACT_ERRNO");
  EXPECT_EQ(mount[0]["errnoRet"], 1);
  EXPECT_TRUE(mount[0]["args"].empty());
  for (const char* name : {"unshare", "setns", "bpf", "keyctl", "io_uring_setup", "ptrace",
                           "open_by_handle_at", "userfaultfd"})
    EXPECT_THAT(mount[0]["names"], ::testing::Contains(name));

  const auto clone3 = entries_for(profile, "clone3");
  ASSERT_EQ(clone3.size(), 1u);
  EXPECT_EQ(clone3[0]["errnoRet"], 38);

  // One MASKED_EQ per namespace flag on clone's flags.
  const auto clone = entries_for(profile, "clone");
  EXPECT_EQ(clone.size(), 8u);
  for (const auto& e : clone) {
    ASSERT_EQ(e["args"].size(), 1u);
    EXPECT_EQ(e["args"][0]["index"], 0);
    EXPECT_EQ(e["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
    EXPECT_EQ(e["args"][0]["value"], e["args"][0]["valueTwo"]);
  }

  const auto ioctl = entries_for(profile, "ioctl");
  ASSERT_EQ(ioctl.size(), 2u);
  EXPECT_EQ(ioctl[0]["args"][0], (json{{"index", 1},
                                       {"value", 0xffffffffu},
                                       {"valueTwo", TIOCSTI},
                                       {"op", "SCMP_CMP_MASKED_EQ"}}));

  EXPECT_FALSE(entries_for(profile, "personality").empty());

  // Syscalls libseccomp 2.5.4 has no name for are exported by name all the same (Docker resolves
  // names with its own libseccomp).
  EXPECT_THAT(mount[0]["names"], ::testing::Contains("open_tree_attr"));
  const auto statmount = entries_for(profile, "statmount");
  ASSERT_EQ(statmount.size(), 1u);
  EXPECT_EQ(statmount[0]["errnoRet"], ENOSYS);

  // Socket families outside the allow-list, on both socket calls.
  for (const char* name : {"socket", "socketpair"}) {
    const auto entries = entries_for(profile, name);
    ASSERT_FALSE(entries.empty()) << name;
    for (const auto& e : entries) {
      EXPECT_EQ(e["errnoRet"], EAFNOSUPPORT) << e;
      ASSERT_EQ(e["args"].size(), 1u) << e;
      EXPECT_EQ(e["args"][0]["index"], 0) << e;
      EXPECT_EQ(e["args"][0]["op"], "SCMP_CMP_MASKED_EQ") << e;
    }
  }
}

TEST(SeccompDockerProfile, KillActionsAreExportedAsKillProcess) {
  const json profile = docker_profile(
      policy("SCMP_ACT_KILL", {rule({"read", "write", "exit_group"}, "SCMP_ACT_ALLOW"),
                               rule({"uname"}, "SCMP_ACT_KILL_THREAD")}));
  EXPECT_EQ(profile["defaultAction"], "SCMP_ACT_KILL_PROCESS");
  // Killing is the default now, so the uname rule is redundant and gone.
  EXPECT_TRUE(entries_for(profile, "uname").empty());
  EXPECT_EQ(entries_for(profile, "read").at(0)["action"], "SCMP_ACT_ALLOW");
}

TEST(SeccompDockerProfile, RefusesWhatCompileRefuses) {
  EXPECT_THROW(docker_profile(policy("SCMP_ACT_ALLOW", {rule({"mount"}, "SCMP_ACT_ALLOW")})),
               Error);
}

TEST(SeccompDockerProfile, ReadBackAsAPolicyItCompilesToTheSameFilter) {
  // The export already holds the preamble; layering it again changes nothing, so Docker and the
  // namespace backend run the same filter.
  for (const Seccomp& s :
       {policy("SCMP_ACT_ALLOW",
               {rule({"uname"}, "SCMP_ACT_ERRNO", 38),
                rule({"socket"}, "SCMP_ACT_ERRNO", 97, {arg(0, "SCMP_CMP_EQ", 2)})}),
        policy("SCMP_ACT_ERRNO",
               {rule({"read", "write", "ioctl", "clone", "personality"}, "SCMP_ACT_ALLOW")}),
        policy("SCMP_ACT_KILL_PROCESS",
               {rule({"read", "exit_group"}, "SCMP_ACT_ALLOW"),
                rule({"ioctl"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 1)})})}) {
    const json profile = docker_profile(s);
    const Seccomp again = from_profile(profile);
    EXPECT_EQ(docker_profile(again), profile) << json::diff(profile, docker_profile(again)).dump(1);
    const auto a = compile(s).instructions, b = compile(again).instructions;
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(a[i].code == b[i].code && a[i].jt == b[i].jt && a[i].jf == b[i].jf &&
                  a[i].k == b[i].k)
          << "instruction " << i;
  }
}

}  // namespace
}  // namespace rlm::seccomp::test
