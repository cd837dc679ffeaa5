// The payload's seccomp programs as rlm-sandbox-init receives them: kill actions compiled as user
// notifications only when there is something to name and the listener can be handed over.
#include <gtest/gtest.h>
#include <linux/seccomp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seccomp/seccomp.hpp"

namespace rlm {
namespace {

Seccomp rules(std::string default_action, std::vector<SeccompRule> syscalls = {}) {
  Seccomp s;
  s.default_action = std::move(default_action);
  s.syscalls = std::move(syscalls);
  return s;
}

SeccompRule rule(std::vector<std::string> names, std::string action,
                 std::optional<int> errno_ret = std::nullopt) {
  return {std::move(names), std::move(action), errno_ret, {}};
}

bool returns(const seccomp::Program& program, std::uint32_t action) {
  for (const auto& insn : program.instructions)
    if (insn.code == (BPF_RET | BPF_K) && (insn.k & SECCOMP_RET_ACTION_FULL) == action) return true;
  return false;
}

TEST(PayloadFilter, KillActionsBecomeNotificationsOnlyOnRequest) {
  const auto kill_uname = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_KILL")});
  const auto plain = seccomp::compile(kill_uname);
  EXPECT_FALSE(plain.notifies);
  EXPECT_TRUE(returns(plain, SECCOMP_RET_KILL_PROCESS));
  EXPECT_FALSE(returns(plain, SECCOMP_RET_USER_NOTIF));

  const auto notify = seccomp::compile(kill_uname, {.kill_as_notify = true});
  EXPECT_TRUE(notify.notifies);
  EXPECT_TRUE(returns(notify, SECCOMP_RET_USER_NOTIF));
  // The bad-architecture kill stays a kill.
  EXPECT_TRUE(returns(notify, SECCOMP_RET_KILL_PROCESS));

  // Without kill actions there is nothing to notify.
  EXPECT_FALSE(seccomp::compile(rules("SCMP_ACT_ALLOW"), {.kill_as_notify = true}).notifies);
  // A kill default (an allow-list) notifies too.
  const auto allow_list =
      rules("SCMP_ACT_KILL_PROCESS", {rule({"read", "write"}, "SCMP_ACT_ALLOW")});
  EXPECT_TRUE(seccomp::compile(allow_list, {.kill_as_notify = true}).notifies);
}

TEST(PayloadFilter, AllowsEveryCallSeesRulesAndTheDefault) {
  EXPECT_TRUE(seccomp::allows_every_call(rules("SCMP_ACT_ALLOW"), "sendmsg"));
  EXPECT_FALSE(seccomp::allows_every_call(rules("SCMP_ACT_ALLOW"), "mount"));  // the preamble
  EXPECT_FALSE(seccomp::allows_every_call(rules("SCMP_ACT_ALLOW"), "clone"));  // partly denied
  EXPECT_FALSE(seccomp::allows_every_call(
      rules("SCMP_ACT_ALLOW", {rule({"sendmsg"}, "SCMP_ACT_ERRNO", 1)}), "sendmsg"));
  EXPECT_TRUE(seccomp::allows_every_call(
      rules("SCMP_ACT_ERRNO", {rule({"sendmsg"}, "SCMP_ACT_ALLOW")}), "sendmsg"));
  EXPECT_FALSE(seccomp::allows_every_call(rules("SCMP_ACT_ERRNO"), "sendmsg"));
  EXPECT_FALSE(seccomp::allows_every_call(rules("SCMP_ACT_ALLOW"), "no_such_syscall"));
}

std::size_t memfd_size(const host::UniqueFd& fd) {
  struct stat info {};
  return fstat(fd.get(), &info) == 0 ? static_cast<std::size_t>(info.st_size) : 0;
}

TEST(PayloadFilter, TheNotifyProgramIsPreparedOnlyWhenItCanWork) {
  const auto kill_uname = rule({"uname"}, "SCMP_ACT_KILL_PROCESS");
  auto both = seccomp::prepare_payload_filter(rules("SCMP_ACT_ALLOW", {kill_uname}));
  ASSERT_TRUE(both.kill);
  ASSERT_TRUE(both.notify);
  EXPECT_GT(memfd_size(both.kill), 0u);
  EXPECT_EQ(memfd_size(both.kill) % sizeof(sock_filter), 0u);
  // Sealed: nobody can change the program after it was written.
  EXPECT_LT(write(both.kill.get(), "x", 1), 0);

  EXPECT_FALSE(seccomp::prepare_payload_filter(rules("SCMP_ACT_ALLOW")).notify);
  // The payload must be able to send the listener to init after installing the filter.
  EXPECT_FALSE(seccomp::prepare_payload_filter(
                   rules("SCMP_ACT_ALLOW", {kill_uname, rule({"sendmsg"}, "SCMP_ACT_ERRNO", 1)}))
                   .notify);
}

}  // namespace
}  // namespace rlm
