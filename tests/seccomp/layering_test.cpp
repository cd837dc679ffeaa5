// How policy rules layer on the preamble, and what compile() refuses (no kernel involved).
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <set>

#include <gmock/gmock.h>

#include "seccomp/model.hpp"
#include "seccomp_test_util.hpp"

namespace rlm::seccomp::test {
namespace {

using ::testing::HasSubstr;

// The single problem check() reports, as "path: message".
std::string only_problem(const Seccomp& s) {
  const auto problems = check(s);
  EXPECT_EQ(problems.size(), 1u);
  if (problems.size() != 1) {
    for (const auto& p : problems) ADD_FAILURE() << p.to_string();
    return "";
  }
  // compile() refuses the same policy, naming the problem.
  try {
    compile(s);
    ADD_FAILURE() << "compile() accepted it";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(problems[0].to_string()));
  }
  return problems[0].to_string();
}

void expect_accepted(const Seccomp& s) {
  for (const auto& p : check(s)) ADD_FAILURE() << p.to_string();
  EXPECT_NO_THROW(compile(s));
}

TEST(SeccompLayering, APolicyCannotAllowWhatThePreambleDenies) {
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ALLOW", {rule({"getpid", "mount"}, "SCMP_ACT_ALLOW")})),
              HasSubstr("seccomp.syscalls[0]: \"mount\" is denied by the mandatory preamble"));
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ERRNO", {rule({"unshare"}, "SCMP_ACT_LOG")})),
              HasSubstr("a policy cannot log-and-allow it"));
  EXPECT_THAT(
      only_problem(policy("SCMP_ACT_ERRNO", {rule({"clone3"}, "SCMP_ACT_ALLOW", std::nullopt,
                                                  {arg(0, "SCMP_CMP_NE", 0)})})),
      HasSubstr("\"clone3\" is denied"));
}

TEST(SeccompLayering, APolicyMayDenyPreambleSyscallsMoreStrictly) {
  // The design document's example: ptrace and bpf with errno 1 (EPERM, as the preamble).
  expect_accepted(policy("SCMP_ACT_ALLOW", {rule({"ptrace", "bpf"}, "SCMP_ACT_ERRNO", 1)}));
  expect_accepted(policy("SCMP_ACT_ALLOW", {rule({"mount"}, "SCMP_ACT_KILL_PROCESS"),
                                            rule({"clone3"}, "SCMP_ACT_ERRNO", 38),
                                            rule({"personality"}, "SCMP_ACT_TRAP")}));
  // A conditional rule may restate the preamble's action, but not change it for some calls only.
  expect_accepted(
      policy("SCMP_ACT_ALLOW", {rule({"bpf"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_EQ", 5)})}));
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ALLOW", {rule({"bpf"}, "SCMP_ACT_KILL", std::nullopt,
                                                          {arg(0, "SCMP_CMP_EQ", 5)})})),
              HasSubstr("a rule may replace that action only for every call, so drop its args"));
}

TEST(SeccompLayering, AllowRulesOnPartlyDeniedSyscallsApplyOnlyOutsideTheDenial) {
  // Docker's default profile allows clone without namespace flags and five personas.
  expect_accepted(policy(
      "SCMP_ACT_ERRNO",
      {rule({"clone"}, "SCMP_ACT_ALLOW", std::nullopt,
            {arg(0, "SCMP_CMP_MASKED_EQ", 0x7e020000, 0)}),
       rule({"personality"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 0x0)}),
       rule({"personality"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 0x20008)}),
       rule({"personality"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 0xffffffff)}),
       rule({"ioctl"}, "SCMP_ACT_ALLOW"),
       rule({"ioctl"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 1)})}));
  // An allow rule that only covers denied calls could never apply.
  EXPECT_THAT(
      only_problem(policy("SCMP_ACT_ERRNO", {rule({"personality"}, "SCMP_ACT_ALLOW", std::nullopt,
                                                  {arg(0, "SCMP_CMP_EQ", READ_IMPLIES_EXEC)})})),
      HasSubstr("only matches \"personality\" calls the mandatory preamble denies"));
  // Narrowing needs one comparison per argument: a bound on clone's flags cannot be combined
  // with the preamble's flag masks.
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ERRNO", {rule({"clone"}, "SCMP_ACT_ALLOW", std::nullopt,
                                                          {arg(0, "SCMP_CMP_GT", 0x100)})})),
              HasSubstr("cannot be narrowed"));
}

TEST(SeccompLayering, SocketFamiliesAreAnAllowList) {
  // An allow-list's socket rule applies to the four families the preamble leaves alone.
  for (const char* name : {"socket", "socketpair"}) {
    std::vector<Diagnostic> problems;
    const detail::Filter filter =
        detail::layer(policy("SCMP_ACT_ERRNO", {rule({name}, "SCMP_ACT_ALLOW")}), problems);
    ASSERT_TRUE(problems.empty());
    std::set<std::uint64_t> allowed;
    for (const auto& r : filter.rules) {
      if (r.syscall != name) continue;
      ASSERT_EQ(r.conditions.size(), 1u);
      if (r.action.verdict == detail::Verdict::allow) {
        for (const std::uint64_t family :
             {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_VSOCK, AF_PACKET, AF_ALG, AF_UNSPEC})
          if (r.conditions[0].holds(family)) allowed.insert(family);
      } else {
        EXPECT_EQ(r.action, (detail::Action{detail::Verdict::errno_, EAFNOSUPPORT})) << name;
        EXPECT_FALSE(r.conditions[0].holds(AF_INET)) << name;
      }
    }
    EXPECT_EQ(allowed, (std::set<std::uint64_t>{AF_UNIX, AF_INET, AF_INET6, AF_NETLINK})) << name;
  }
  // A rule that could only allow a denied family never applies.
  EXPECT_THAT(
      only_problem(policy("SCMP_ACT_ERRNO", {rule({"socket"}, "SCMP_ACT_ALLOW", std::nullopt,
                                                  {arg(0, "SCMP_CMP_EQ", AF_VSOCK)})})),
      HasSubstr("only matches \"socket\" calls the mandatory preamble denies"));
  // Denying an allowed family is the policy's business.
  expect_accepted(policy("SCMP_ACT_ALLOW", {rule({"socket"}, "SCMP_ACT_ERRNO", EACCES,
                                                 {arg(0, "SCMP_CMP_EQ", AF_INET6)})}));
}

TEST(SeccompLayering, SyscallsNewerThanLibseccompAreKnownByNumber) {
  // libseccomp 2.5.4 does not know these names; the compiler does, so policies may name them.
  EXPECT_EQ(detail::resolve_syscall("open_tree_attr"), 467);
  EXPECT_EQ(detail::resolve_syscall("statmount"), 457);
  EXPECT_EQ(detail::resolve_syscall("listmount"), 458);
  EXPECT_EQ(syscall_name(467), "open_tree_attr");
  expect_accepted(policy("SCMP_ACT_ALLOW", {rule({"mseal"}, "SCMP_ACT_ERRNO", 38)}));
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ALLOW", {rule({"open_tree_attr"}, "SCMP_ACT_ALLOW")})),
              HasSubstr("\"open_tree_attr\" is denied by the mandatory preamble"));
}

TEST(SeccompLayering, NarrowedAllowRulesLeaveTheDeniedCallsToThePreamble) {
  std::vector<Diagnostic> problems;
  const detail::Filter filter = detail::layer(
      policy("SCMP_ACT_ERRNO",
             {rule({"ioctl"}, "SCMP_ACT_ALLOW", std::nullopt, {arg(0, "SCMP_CMP_EQ", 1)})}),
      problems);
  ASSERT_TRUE(problems.empty());
  for (const auto& r : filter.rules) {
    if (r.syscall != "ioctl") continue;
    ASSERT_EQ(r.action.verdict, detail::Verdict::allow) << "EPERM is the default here";
    // fd 1, and a request that is neither TIOCSTI nor TIOCLINUX.
    EXPECT_EQ(r.conditions.size(), 2u);
    EXPECT_EQ(r.conditions[0], (detail::Comparison{0, SCMP_CMP_EQ, 1, 0}));
    for (const std::uint64_t request :
         {std::uint64_t{TIOCSTI}, std::uint64_t{TIOCLINUX}, (std::uint64_t{1} << 32) | TIOCSTI})
      EXPECT_FALSE(r.conditions[1].holds(request));
  }
}

TEST(SeccompLayering, ConflictingPolicyRulesAreRefused) {
  // libseccomp would silently keep only the argument-less rule.
  EXPECT_THAT(
      only_problem(policy("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 38),
                                             rule({"uname"}, "SCMP_ACT_KILL", std::nullopt,
                                                  {arg(0, "SCMP_CMP_EQ", 0)})})),
      HasSubstr(
          "seccomp.syscalls[1]: \"uname\" also has a rule without args at seccomp.syscalls[0]"));
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 38),
                                                     rule({"uname"}, "SCMP_ACT_ERRNO", 1)})),
              HasSubstr("also has a rule without args"));
  // Overlapping conditional rules would be resolved by libseccomp's internal order.
  EXPECT_THAT(only_problem(policy(
                  "SCMP_ACT_ALLOW",
                  {rule({"fcntl"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_EQ", 2)}),
                   rule({"fcntl"}, "SCMP_ACT_KILL", std::nullopt, {arg(1, "SCMP_CMP_EQ", 1)})})),
              HasSubstr("may match the same \"fcntl\" calls as seccomp.syscalls[0]"));
  // Exclusive ones are fine, and so are duplicates with one action.
  expect_accepted(
      policy("SCMP_ACT_ALLOW",
             {rule({"socket"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_EQ", 2)}),
              rule({"socket"}, "SCMP_ACT_KILL", std::nullopt, {arg(0, "SCMP_CMP_EQ", 10)}),
              rule({"uname", "uname"}, "SCMP_ACT_ERRNO", 38),
              rule({"uname"}, "SCMP_ACT_ERRNO", 38, {arg(0, "SCMP_CMP_EQ", 0)})}));
  // A partly denied syscall: a different denial must stay clear of the preamble's.
  EXPECT_THAT(only_problem(policy("SCMP_ACT_ALLOW", {rule({"ioctl"}, "SCMP_ACT_KILL", std::nullopt,
                                                          {arg(0, "SCMP_CMP_EQ", 0)})})),
              HasSubstr("may match \"ioctl\" calls the mandatory preamble denies"));
}

TEST(SeccompLayering, MalformedRulesAreRefusedAllAtOnce) {
  const auto problems = check(policy(
      "SCMP_ACT_MAYBE",
      {rule({"no_such_syscall"}, "SCMP_ACT_ALLOW"), rule({"uname"}, "SCMP_ACT_TRACE"),
       rule({"uname"}, "SCMP_ACT_KILL", 1), rule({"uname"}, "SCMP_ACT_ERRNO", 5000),
       rule({}, "SCMP_ACT_ALLOW"), rule({"read"}, "SCMP_ACT_ERRNO", 1, {arg(6, "SCMP_CMP_EQ", 0)}),
       rule({"read"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_LIKE", 0)}),
       rule({"read"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_GT", 1), arg(0, "SCMP_CMP_LT", 9)}),
       rule({"read"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_EQ", 1), arg(0, "SCMP_CMP_EQ", 2)}),
       rule({"read"}, "SCMP_ACT_ERRNO", 1, {arg(0, "SCMP_CMP_LT", 0)})}));
  std::vector<std::string> text;
  for (const auto& p : problems) text.push_back(p.to_string());
  EXPECT_THAT(
      text,
      ::testing::ElementsAre(
          HasSubstr("seccomp.defaultAction: unknown action \"SCMP_ACT_MAYBE\""),
          HasSubstr("seccomp.syscalls[0].names[0]: unknown syscall \"no_such_syscall\""),
          HasSubstr("seccomp.syscalls[1].action: unknown action \"SCMP_ACT_TRACE\""),
          HasSubstr("seccomp.syscalls[2].errnoRet: only SCMP_ACT_ERRNO takes an errno"),
          HasSubstr("seccomp.syscalls[3].errnoRet: errno 5000 is outside 0..4095"),
          HasSubstr("seccomp.syscalls[4].names: lists no syscall"),
          HasSubstr("seccomp.syscalls[5].args[0].index: syscalls have arguments 0..5, not 6"),
          HasSubstr("seccomp.syscalls[6].args[0].op: unknown comparison \"SCMP_CMP_LIKE\""),
          HasSubstr("seccomp.syscalls[7].args[1]: compares argument 0 a second time"),
          HasSubstr("seccomp.syscalls[8].args[1]: contradicts an earlier comparison"),
          HasSubstr("seccomp.syscalls[9].args: compares argument 0 in a way no value satisfies")));
}

TEST(SeccompLayering, TwoComparisonsOfOneArgumentFuseWhenTheyCan) {
  std::vector<Diagnostic> problems;
  const auto filter = detail::layer(
      policy("SCMP_ACT_ALLOW", {rule({"fcntl"}, "SCMP_ACT_ERRNO", 1,
                                     {arg(1, "SCMP_CMP_MASKED_EQ", 0xf, 2),
                                      arg(1, "SCMP_CMP_MASKED_EQ", 0x80000, 0x80000)})}),
      problems);
  ASSERT_TRUE(problems.empty());
  ASSERT_EQ(filter.rules.back().syscall, "fcntl");
  EXPECT_EQ(filter.rules.back().conditions,
            (detail::Conditions{{1, SCMP_CMP_MASKED_EQ, 0x8000f, 0x80002}}));
}

TEST(SeccompLayering, RulesWithTheDefaultActionAreDropped) {
  std::vector<Diagnostic> problems;
  const auto filter = detail::layer(policy("SCMP_ACT_ERRNO", {rule({"read"}, "SCMP_ACT_ALLOW"),
                                                              rule({"uname"}, "SCMP_ACT_ERRNO")}),
                                    problems);
  ASSERT_TRUE(problems.empty());
  for (const auto& r : filter.rules) EXPECT_NE(r.syscall, "uname");
  // The preamble's own EPERM denials coincide with this default, so only the rest remains.
  for (const auto& r : filter.rules) EXPECT_NE(r.action, filter.default_action) << r.syscall;
  EXPECT_EQ(filter.rules.back().syscall, "read");
}

TEST(SeccompLayering, LargeAllowListFitsTheKernelLimit) {
  // Every syscall this architecture has, allowed one by one, like a generous allow-list.
  std::vector<std::string> names;
  for (int nr = 0; nr < 1024; ++nr) {
    const std::string name = syscall_name(nr);
    if (name.rfind("syscall ", 0) == 0) continue;
    if (!check(policy("SCMP_ACT_ERRNO", {rule({name}, "SCMP_ACT_ALLOW")})).empty()) continue;
    names.push_back(name);
  }
  ASSERT_GT(names.size(), 250u);
  const Program program = compile(policy("SCMP_ACT_ERRNO", {rule(names, "SCMP_ACT_ALLOW")}));
  EXPECT_LE(program.instructions.size(), 4096u);
  RecordProperty("instructions", static_cast<int>(program.instructions.size()));
}

TEST(SeccompLayering, SyscallNames) {
  EXPECT_EQ(syscall_name(SYS_ptrace), "ptrace");
  EXPECT_EQ(syscall_name(SYS_clone3), "clone3");
  EXPECT_EQ(syscall_name(999), "syscall 999");
  EXPECT_EQ(syscall_name(-1), "syscall -1");
}

}  // namespace
}  // namespace rlm::seccomp::test
