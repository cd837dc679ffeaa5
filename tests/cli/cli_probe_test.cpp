// Health and backend selection agree under the refusals a container makes (issue 16's table), each
// made here for real: a seccomp filter refusing the user namespace's clone or pivot_root (installed
// by refuse_setup before it execs the CLI), or /proc with a masked path (a bind over a /proc file
// in a mount namespace of the test's own). In each, health says unavailable with the failing step
// and the fix, a policy that prefers only the namespace backend is refused by selection, and a run
// exits 125 naming the same fix. Nothing of the host is changed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

// A policy that may run on the namespace backend only (the shipped default also names docker).
std::string namespace_only_policy() {
  const std::string path = "/tmp/rlm-probe-test-policy-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"extends": "default", "backend": {"prefer": ["namespace"]}})";
  return path;
}

struct Refused {
  json health;  // the namespace backend's entry
  json selection;
  int health_exit = -1;
  ProcessOutcome run;
};

// `prefix` runs the CLI (its last word is the CLI's path): health --json --policy, then a run.
Refused refused_under(const std::vector<std::string>& prefix) {
  const std::string policy = namespace_only_policy();
  Refused r;
  auto health = prefix;
  health.insert(health.end(), {"health", "--json", "--policy", policy});
  const auto out = run_process(health);
  r.health_exit = out.exit_code;
  const json report = json::parse(out.out);
  r.health = report["backends"][0];
  r.selection = report["selection"];
  auto run = prefix;
  run.insert(run.end(), {"run", "--policy", policy, "--", "/bin/true"});
  r.run = run_process(run);
  std::remove(policy.c_str());
  return r;
}

bool has(const std::string& text, const std::string& token) {
  return text.find(token) != std::string::npos;
}

// The checks every refusal shares: health and selection agree, and the run fails closed with the
// same fix health gives.
void expect_refused_everywhere(const Refused& r, const std::string& step) {
  EXPECT_EQ(r.health["backend"], "namespace");
  EXPECT_EQ(r.health["available"], false) << r.health.dump(2);
  EXPECT_TRUE(has(r.health["detail"], step)) << r.health["detail"];
  EXPECT_EQ(r.health_exit, 1) << "health --policy exits 1 when no backend can run it";
  EXPECT_TRUE(r.selection["backend"].is_null()) << r.selection.dump(2);
  EXPECT_TRUE(has(r.selection["error"], step)) << r.selection.dump(2);
  EXPECT_EQ(r.run.exit_code, 125) << r.run.err;
  const std::string fix = r.health["fix"];
  EXPECT_TRUE(has(r.run.err, fix)) << "the run names health's fix: " << r.run.err;
  EXPECT_TRUE(has(fix, "backend.prefer names landlock")) << "the alternative is named: " << fix;
}

void expect_seccomp_fix(const std::string& fix) {
  EXPECT_TRUE(has(fix, "--security-opt seccomp=")) << fix;
  EXPECT_TRUE(has(fix, "share/rlm-sandbox/containers/rlm-sandbox-seccomp.json")) << fix;
  EXPECT_TRUE(has(fix, "packaging/containers/rlm-sandbox-seccomp.json")) << fix;
  EXPECT_TRUE(has(fix, "seccompProfile")) << fix;
  EXPECT_TRUE(has(fix, "Localhost")) << fix;
}

TEST(CliProbe, SeccompRefusingTheUserNamespaceIsUnavailableWithTheProfileAsFix) {
  const auto r = refused_under({bin_path("refuse_setup"), "userns", "--", bin_path("rlm-sandbox")});
  expect_refused_everywhere(r, "clone of the sandbox's namespaces: Operation not permitted");
  EXPECT_TRUE(has(r.health["detail"], "seccomp filter on the runtime")) << r.health["detail"];
  expect_seccomp_fix(r.health["fix"]);
}

// Docker's --cap-add SYS_ADMIN: namespaces allowed, pivot_root still refused by the profile.
TEST(CliProbe, SeccompRefusingPivotRootIsUnavailableWithTheProfileAsFix) {
  const auto r =
      refused_under({bin_path("refuse_setup"), "pivot_root", "--", bin_path("rlm-sandbox")});
  expect_refused_everywhere(r, "pivot_root into the root tmpfs: Operation not permitted");
  expect_seccomp_fix(r.health["fix"]);
}

// Docker's seccomp=unconfined: /proc keeps its masked paths, so the kernel refuses a new proc mount
// in the sandbox's user namespace.
TEST(CliProbe, MaskedProcIsUnavailableWithSystempathsAndProcMountAsFix) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace of its own";
  // The first of Docker's masked files this kernel has, /dev/null bound over it as Docker does.
  const std::string script =
      "mount --make-rprivate / || exit 3; for p in /proc/kcore /proc/timer_list "
      "/proc/sysrq-trigger; do if [ -e $p ]; then mount --bind /dev/null $p || exit 3; "
      "exec \"$0\" \"$@\"; fi; done; exit 4";
  const auto r = refused_under(
      {"/usr/bin/unshare", "--mount", "/bin/sh", "-c", script, bin_path("rlm-sandbox")});
  expect_refused_everywhere(r, "mount proc on /proc: Operation not permitted");
  EXPECT_TRUE(has(r.health["detail"], "masked paths (/proc/")) << r.health["detail"];
  const std::string fix = r.health["fix"];
  EXPECT_TRUE(has(fix, "systempaths=unconfined")) << fix;
  EXPECT_TRUE(has(fix, "procMount: Unmasked")) << fix;
}

// The control: on this host, unrefused, health and selection both say yes and the run works.
TEST(CliProbe, UnrefusedHealthAndSelectionAgreeAndTheRunWorks) {
  const std::string policy = namespace_only_policy();
  const auto out = cli({"health", "--json", "--policy", policy});
  const json report = json::parse(out.out);
  EXPECT_EQ(report["backends"][0]["available"], true) << out.out;
  EXPECT_EQ(report["selection"]["backend"], "namespace") << out.out;
  EXPECT_EQ(cli({"run", "--policy", policy, "--", "/bin/true"}).exit_code, 0);
  std::remove(policy.c_str());
}

// A run whose memory limit a per-process rlimit stood in for (no writable cgroup: every cgroup
// mount remounted read-only in a mount namespace of the test's own) says so once on stderr; with
// --json, stdout is the Result alone.
TEST(CliProbe, AStandInLimitIsNotedOnStderrOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace of its own";
  const std::string script =
      "mount --make-rprivate / && for d in /sys/fs/cgroup /sys/fs/cgroup/*; do "
      "if mountpoint -q \"$d\"; then mount -o remount,bind,ro \"$d\" || exit 3; fi; done; "
      "exec \"$0\" \"$@\"";
  for (const bool as_json : {false, true}) {
    std::vector<std::string> args = {"/usr/bin/unshare",      "--mount", "/bin/sh", "-c", script,
                                     bin_path("rlm-sandbox"), "run"};
    if (as_json) args.push_back("--json");
    args.insert(args.end(), {"--", "/bin/true"});
    const auto out = run_process(args);
    ASSERT_EQ(out.exit_code, 0) << out.err;
    EXPECT_TRUE(one_line(out.err)) << out.err;
    EXPECT_TRUE(has(out.err, "note: not enforced as the policy means them here: ")) << out.err;
    EXPECT_TRUE(has(out.err, "limits.memory_bytes")) << out.err;
    if (as_json) {
      EXPECT_EQ(json::parse(out.out)["status"], "ok") << out.out;
    } else {
      EXPECT_EQ(out.out, "");
    }
  }
}

}  // namespace
}  // namespace rlm::test
