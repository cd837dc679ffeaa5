// rlm-sandbox-init on its own: its command line, its exit status, its report line, and its
// handling of SIGTERM and forwarded signals.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include <fstream>

#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

std::string init() {
  return bin_path("rlm-sandbox-init");
}

// Runs a shell snippet where $INIT is rlm-sandbox-init.
ProcessOutcome shell(const std::string& script) {
  ProcessOptions options;
  options.extra_env = {{"INIT", init()}};
  options.kill_after = std::chrono::seconds(30);
  return run_process({"/bin/sh", "-c", script}, options);
}

TEST(Init, MirrorsThePayloadsExitStatus) {
  auto out = run_process({init(), "--", "sh", "-c", "echo hi; exit 3"});
  EXPECT_EQ(out.exit_code, 3);
  EXPECT_EQ(out.out, "hi\n");
  auto killed = run_process({init(), "--", "sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(killed.exit_code, 128 + 15);
}

TEST(Init, ReportsOnTheReportFd) {
  TempDir dir;
  auto out = shell("$INIT --report-fd 3 -- sh -c 'exit 4' 3>" + dir.file("report"));
  EXPECT_EQ(out.exit_code, 4);
  const auto report = dir.read("report");
  EXPECT_EQ(report.rfind("{\"exit_code\":4,\"cpu_us\":", 0), 0u) << report;
  EXPECT_EQ(report.back(), '\n');

  shell("$INIT --report-fd 3 -- sh -c 'kill -SEGV $$' 3>" + dir.file("signal"));
  EXPECT_EQ(dir.read("signal").rfind("{\"signal\":11,", 0), 0u) << dir.read("signal");
}

TEST(Init, ReportsExecAndSetupFailures) {
  TempDir dir;
  auto missing = shell("$INIT --report-fd 3 -- 'no such \"cmd\"' 3>" + dir.file("exec"));
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_EQ(dir.read("exec"), "{\"exec_errno\":2,\"path\":\"no such \\\"cmd\\\"\"}\n");

  auto chdir = shell("$INIT --report-fd 3 --chdir /nonexistent -- true 3>" + dir.file("chdir"));
  EXPECT_EQ(chdir.exit_code, 125);
  EXPECT_EQ(dir.read("chdir"),
            "{\"setup_errno\":2,\"step\":\"chdir\",\"path\":\"/nonexistent\"}\n");

  // Without a report fd the reason goes to stderr.
  auto plain = run_process({init(), "--", "no-such-command-rlm"});
  EXPECT_EQ(plain.exit_code, 127);
  EXPECT_NE(plain.err.find("no-such-command-rlm"), std::string::npos) << plain.err;
}

TEST(Init, RejectsABadCommandLine) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--bogus", "--", "true"},
                                               {"--rlimit", "cpu=2:1", "--", "true"},
                                               {"--rlimit", "wings=1", "--", "true"},
                                               {"--grace-ms", "soon", "--", "true"},
                                               {"--guard-signals", "--", "true"},
                                               {"--"},
                                               {}}) {
    std::vector<std::string> argv{init()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto out = run_process(argv);
    EXPECT_EQ(out.exit_code, 125) << out.err;
    EXPECT_NE(out.err.find("usage: rlm-sandbox-init"), std::string::npos) << out.err;
  }
}

TEST(Init, AppliesRlimitsButNeverRaisesAHardLimit) {
  auto out = run_process({init(), "--rlimit", "nofile=50:60", "--rlimit", "core=0", "--", "sh",
                          "-c", "ulimit -Sn; ulimit -Hn; ulimit -c"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "50\n60\n0\n");
  // Far above any hard limit: clamped to the current one instead of failing.
  auto clamped = shell(
      "hard=$(ulimit -Hn); $INIT --rlimit nofile=999999999 -- sh -c "
      "'[ \"$(ulimit -Hn)\" = '$hard' ] && echo same'");
  EXPECT_EQ(clamped.exit_code, 0) << clamped.err;
  EXPECT_EQ(clamped.out, "same\n");
}

TEST(Init, SigtermStopsTheTreeAfterTheGrace) {
  TempDir dir;
  // The payload ignores SIGTERM, so init must fall back to SIGKILL once 200 ms have passed.
  auto out = shell(
      "$INIT --report-fd 3 --grace-ms 200 -- sh -c \"trap '' TERM; "
      "while :; do sleep 0.05; done\" 3>" +
      dir.file("report") + " & pid=$!; sleep 0.3; kill $pid; wait $pid; echo $?");
  EXPECT_EQ(out.out, "137\n");
  EXPECT_EQ(dir.read("report").rfind("{\"signal\":9,", 0), 0u) << dir.read("report");
  EXPECT_NE(dir.read("report").find("\"terminated\":true"), std::string::npos);
  EXPECT_EQ(dir.read("report").find("terminated_by_payload"), std::string::npos)
      << "the SIGTERM came from the launching shell, outside init's tree";
  EXPECT_LT(out.wall.count(), 2000);
}

// Issue 11, line 14: a SIGTERM the payload sends to init is reported as the payload's.
TEST(Init, ReportsASigtermFromThePayloadAsSuch) {
  TempDir dir;
  auto out =
      shell("$INIT --report-fd 3 -- sh -c 'kill -TERM $PPID; sleep 5' 3>" + dir.file("report"));
  EXPECT_EQ(out.exit_code, 128 + 15);
  const auto report = dir.read("report");
  EXPECT_NE(report.find("\"terminated\":true,\"terminated_by_payload\":true"), std::string::npos)
      << report;
}

// A seccomp program that allows everything, for --seccomp-fd.
std::string allow_all_program(const TempDir& dir) {
  const sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  const auto path = dir.file("allow.bpf");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(&allow), sizeof allow);
  return path;
}

// Issue 11, line 5 (init's half): with --guard-signals the payload may signal itself and what it
// started, not an older process (here init itself; in a session, its checkpoints).
TEST(Init, GuardedPayloadSignalsOnlyItselfAndWhatItStarted) {
  TempDir dir;
  auto out = shell(
      "$INIT --seccomp-fd 4 --guard-signals -- sh -c '"
      "kill -USR1 $PPID 2>/dev/null; echo older $?; "
      "sleep 5 & kill $!; wait $!; echo child $?; "
      "kill -0 $PPID; echo probe $?; "
      "trap \"echo self\" USR2; kill -USR2 $$' 4<" +
      allow_all_program(dir));
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "older 1\nchild 143\nprobe 0\nself\n");
}

// Where the kernel refuses the guard its listener (here: an outer filter already has one), the
// payload does not run unguarded: init reports the setup failure.
TEST(Init, TheGuardFailsClosedWhenTheKernelRefusesItsListener) {
  TempDir dir;
  const std::string outer_listener =
      "python3 -c \"import ctypes, os, struct, sys\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"
      "insn = ctypes.create_string_buffer(struct.pack('HBBI', 6, 0, 0, 0x7fff0000))\n"
      "prog = ctypes.create_string_buffer(struct.pack('HxxxxxxQ', 1, ctypes.addressof(insn)))\n"
      "fd = libc.syscall(317, 1, 8, prog)\n"
      "assert fd >= 0, ctypes.get_errno()\n"
      "os.set_inheritable(fd, True)\n"
      "os.execv(sys.argv[1], sys.argv[1:])\" ";
  auto out = shell(outer_listener + "$INIT --report-fd 3 --seccomp-fd 4 --guard-signals -- " +
                   "echo unguarded 3>" + dir.file("report") + " 4<" + allow_all_program(dir));
  EXPECT_EQ(out.exit_code, 125) << out.err;
  EXPECT_EQ(out.out, "");
  EXPECT_EQ(dir.read("report").rfind("{\"setup_errno\":16,\"step\":\"guard\",", 0), 0u)
      << dir.read("report");
}

TEST(Init, ForwardsSignalsToThePayload) {
  auto out = shell(
      "$INIT -- sh -c \"trap 'echo got-usr1; exit 7' USR1; "
      "while :; do sleep 0.05; done\" & pid=$!; sleep 0.3; kill -USR1 $pid; "
      "wait $pid; echo status $?");
  EXPECT_EQ(out.out, "got-usr1\nstatus 7\n");
}

TEST(Init, ResetsInheritedIgnoredSignals) {
  // An ignored SIGINT in the launcher must not be inherited by the payload through init.
  auto out = shell("trap '' INT; $INIT -- sh -c 'kill -INT $$; echo survived'; echo status $?");
  EXPECT_EQ(out.out, "status 130\n");
}

}  // namespace
}  // namespace rlm::test
