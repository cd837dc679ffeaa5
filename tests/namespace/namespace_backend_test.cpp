// The namespace backend end to end: what a payload sees inside the sandbox and what the Result
// says about it. (Escape attempts are the security suite's: security_escape_*_test.cpp.)
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "exit_status.hpp"
#include "namespace_backend_test_util.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm::test {
namespace {

TEST(NamespaceBackend, EchoesAndReportsTheExitCode) {
  const auto echo = run_ns({"echo", "hello", "sandbox"});
  EXPECT_EQ(echo.status, Status::ok) << describe(echo);
  EXPECT_EQ(echo.stdout_data, "hello sandbox\n");
  EXPECT_EQ(echo.backend, "namespace");
  EXPECT_EQ(echo.exit_code, 0);

  const auto failing = run_sh("echo out; echo err >&2; exit 3");
  EXPECT_EQ(failing.status, Status::exit_nonzero) << describe(failing);
  EXPECT_EQ(failing.exit_code, 3);
  EXPECT_EQ(failing.stdout_data, "out\n");
  EXPECT_EQ(failing.stderr_data, "err\n");
  EXPECT_EQ(cli::exit_status(failing), 3);
}

TEST(NamespaceBackend, ForwardsStdin) {
  Request request;
  request.stdin_data = "line one\nline two\n";
  const auto result = run_ns({"cat"}, ns_policy(), request);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, request.stdin_data);

  // More than a pipe holds, so the pump has to interleave with the payload's output.
  request.stdin_data = std::string(1 << 20, 'x');
  const auto big = run_sh("wc -c", ns_policy(), request);
  EXPECT_EQ(big.status, Status::ok) << describe(big);
  EXPECT_EQ(big.stdout_data, std::to_string(1 << 20) + "\n");
}

TEST(NamespaceBackend, EnvironmentIsExactlyThePolicysAndTheRequests) {
  Request request;
  request.env = {{"GREETING", "hi"}};
  setenv("RLM_TEST_HOST_ONLY", "leak", 1);
  const auto result = run_ns({"env"}, ns_policy(), request);
  unsetenv("RLM_TEST_HOST_ONLY");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("GREETING=hi\n"), std::string::npos) << result.stdout_data;
  EXPECT_NE(result.stdout_data.find("PATH=/usr/local/bin:/usr/bin:/bin\n"), std::string::npos);
  EXPECT_NE(result.stdout_data.find("HOME=/tmp\n"), std::string::npos);
  EXPECT_EQ(result.stdout_data.find("RLM_TEST_HOST_ONLY"), std::string::npos);
}

TEST(NamespaceBackend, StartsInTheWorkdir) {
  EXPECT_EQ(run_ns({"pwd"}).stdout_data, "/tmp\n");
  Policy policy = ns_policy();
  policy.filesystem.workdir = "/usr/bin";
  const auto result = run_ns({"pwd"}, policy);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "/usr/bin\n");
}

TEST(NamespaceBackend, InitIsPid1AndThePayloadItsChild) {
  const auto result = run_sh("echo $$; tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/1/comm");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  std::istringstream lines(result.stdout_data);
  std::string pid, cmdline, comm;
  std::getline(lines, pid);
  std::getline(lines, cmdline);
  std::getline(lines, comm);
  EXPECT_EQ(pid, "2");
  EXPECT_TRUE(cmdline.starts_with("rlm-sandbox-init ")) << cmdline;
  EXPECT_NE(cmdline.find("--pid1"), std::string::npos) << cmdline;
  EXPECT_EQ(comm, "rlm-sandbox-ini");  // comm holds 15 characters
}

TEST(NamespaceBackend, PayloadRunsUnprivileged) {
  const auto result = run_sh(
      "id -u; id -g; grep -E '^(CapEff|CapPrm|NoNewPrivs|Seccomp):' "
      "/proc/self/status; hostname");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data,
            "1000\n1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
            "NoNewPrivs:\t1\nSeccomp:\t2\nsandbox\n");
}

TEST(NamespaceBackend, FilesWrittenToAWritableBindBelongToTheCaller) {
  TempDir dir;
  Policy policy = ns_policy();
  bind_writable(policy, dir, "/out");
  const auto result = run_sh("id -u > /out/made; ls -ln /out/made | cut -d' ' -f3", policy);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "1000\n");  // inside, the file is the sandbox user's
  struct stat info {};
  ASSERT_EQ(stat(dir.file("made").c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, written_uid());  // the caller's, root's too
  EXPECT_EQ(info.st_gid, written_gid());
  EXPECT_EQ(dir.read("made"), "1000\n");
}

TEST(NamespaceBackend, AMissingCommandIs127) {
  const auto result = run_ns({"no-such-command-anywhere"});
  EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);
  EXPECT_EQ(result.exit_code, 127);
  EXPECT_EQ(cli::exit_status(result), 127);
  EXPECT_NE(result.detail.find("no-such-command-anywhere"), std::string::npos) << result.detail;
}

TEST(NamespaceBackend, AKillRuleIsASeccompViolationThatNamesTheSyscall) {
  for (const char* action : {"SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"}) {
    Policy policy = ns_policy();
    policy.seccomp.syscalls.push_back({{"uname"}, action, std::nullopt, {}});
    const auto result = run_sh("echo before; uname; echo after", policy);
    EXPECT_EQ(result.status, Status::seccomp_violation) << action << " " << describe(result);
    EXPECT_EQ(result.detail, "syscall uname denied by the seccomp policy") << describe(result);
    EXPECT_EQ(result.signal, SIGSYS);
    EXPECT_EQ(result.stdout_data, "before\n");  // the denied call never returned
    EXPECT_EQ(cli::exit_status(result), 128 + SIGSYS);
  }
}

TEST(NamespaceBackend, AViolationInAGrandchildEndsTheWholeRun) {
  Policy policy = ns_policy();
  policy.seccomp.syscalls.push_back({{"uname"}, "SCMP_ACT_KILL_PROCESS", std::nullopt, {}});
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_sh("(sleep 0.1; uname) & sleep 30", policy);
  EXPECT_EQ(result.status, Status::seccomp_violation) << describe(result);
  EXPECT_NE(result.detail.find("uname"), std::string::npos) << result.detail;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(NamespaceBackend, WithoutTheListenerHandoverAKillIsStillAViolation) {
  // A policy that denies sendmsg leaves the payload no way to hand its listener to init: the
  // filter is then installed as written and the kill is the kernel's own (SIGSYS, no name).
  Policy policy = ns_policy();
  policy.seccomp.syscalls.push_back({{"uname"}, "SCMP_ACT_KILL_PROCESS", std::nullopt, {}});
  policy.seccomp.syscalls.push_back({{"sendmsg"}, "SCMP_ACT_ERRNO", 1, {}});
  const auto result = run_ns({"uname"}, policy);
  EXPECT_EQ(result.status, Status::seccomp_violation) << describe(result);
  EXPECT_EQ(result.signal, SIGSYS);
  EXPECT_EQ(result.stdout_data, "");
  // Without init watching, a kill is only the killed process's: the shell carries on.
  const auto shell = run_sh("uname; echo after", policy);
  EXPECT_EQ(shell.status, Status::ok) << describe(shell);
  EXPECT_EQ(shell.stdout_data, "after\n");
}

TEST(NamespaceBackend, TheMandatoryPreambleStillAnswersWithErrors) {
  const auto result = run_sh("unshare -U true; echo $?");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data, "0\n");
}

TEST(NamespaceBackend, AnUnusableMountIsASandboxErrorNamingIt) {
  Policy policy = ns_policy();
  Mount missing;
  missing.source = "/nonexistent/rlm-sandbox-test";
  missing.target = "/data";
  policy.filesystem.mounts.push_back(missing);
  const auto result = run_ns({"true"}, policy);
  EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  EXPECT_NE(result.detail.find("/nonexistent/rlm-sandbox-test"), std::string::npos)
      << result.detail;
  EXPECT_EQ(cli::exit_status(result), 125);
}

TEST(NamespaceBackend, AFailingSetupStepIsASandboxErrorNamingIt) {
  Policy policy = ns_policy();
  policy.hostname = std::string(100, 'h');  // longer than the kernel's 64
  const auto result = run_ns({"true"}, policy);
  EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  EXPECT_EQ(result.detail, "sandbox setup failed: sethostname: Invalid argument");
}

// The payload's message is sent while the child still builds the sandbox. A message larger than
// the socket's buffer is still being sent when the child fails and exits, and the send breaks
// (EPIPE): the Result names the child's step all the same, not the broken hand-over.
TEST(NamespaceBackend, AFailingSetupStepIsNamedWhenThePayloadWasStillBeingHandedOver) {
  Policy policy = ns_policy();
  policy.hostname = std::string(100, 'h');
  Request request;
  for (int i = 0; i < 16; ++i)
    request.env["FILL" + std::to_string(i)] = std::string(128 << 10, 'x');
  const auto result = run_ns({"true"}, policy, std::move(request));
  EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  EXPECT_EQ(result.detail, "sandbox setup failed: sethostname: Invalid argument");
}

TEST(NamespaceBackend, StreamsOutputToCallbacks) {
  Request request;
  std::string streamed;
  request.on_stdout = [&](std::string_view chunk) { streamed += chunk; };
  const auto result = run_sh("for i in 1 2 3; do echo $i; done", ns_policy(), request);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(streamed, "1\n2\n3\n");
  EXPECT_TRUE(result.stdout_data.empty());
}

TEST(NamespaceBackend, HealthSaysWhatItEnforces) {
  const auto health = ns::make_namespace_backend()->health();
  EXPECT_TRUE(health.available) << health.detail << " / " << health.fix;
  EXPECT_TRUE(health.isolated);
  EXPECT_NE(health.detail.find("PID 1"), std::string::npos) << health.detail;
  const auto enforced = nlohmann::json(health.enforced).dump();
  for (const char* field : {"seccomp", "namespaces", "filesystem.mounts", "limits.memory_bytes"})
    EXPECT_NE(enforced.find(field), std::string::npos) << field << " in " << enforced;
}

TEST(NamespaceBackend, TheCliRunsTheDefaultPolicyOnIt) {
  TempDir dir;
  ProcessOptions options;
  options.workdir = dir.path();
  const auto out = run_process({bin_path("rlm-sandbox"), "run", "--json", "--", "true"}, options);
  ASSERT_EQ(out.exit_code, 0) << out.out << out.err;
  const auto json = nlohmann::json::parse(out.out);
  EXPECT_EQ(json["backend"], "namespace");
  EXPECT_EQ(json["status"], "ok");
  EXPECT_EQ(json["policy"], "default");

  const auto selection = select_backend(load_policy("default"));
  EXPECT_EQ(selection->name(), "namespace");
}

}  // namespace
}  // namespace rlm::test
