// `rlm-sandbox run` end to end: the exit-status contract, output, limits and bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

TEST(CliRun, JsonReportsExitNonzeroWithOutput) {
  auto out =
      cli({"run", "--policy", "trusted-local", "--json", "--", "sh", "-c", "echo hi; exit 3"});
  EXPECT_EQ(out.exit_code, 3) << out.err;
  auto result = json::parse(out.out);
  EXPECT_EQ(result["status"], "exit_nonzero");
  EXPECT_EQ(result["exit_code"], 3);
  EXPECT_EQ(result["signal"], 0);
  EXPECT_EQ(result["stdout"], "hi\n");
  EXPECT_EQ(result["backend"], "local");
  EXPECT_EQ(result["policy"], "trusted-local");
  for (const char* key : {"status", "exit_code", "signal", "detail", "wall_ms", "cpu_ms",
                          "peak_memory_bytes", "stdout", "stderr", "stdout_truncated",
                          "stderr_truncated", "backend", "policy", "unenforced"})
    EXPECT_TRUE(result.contains(key)) << key;
  EXPECT_EQ(result.size(), 14u) << result.dump();
}

TEST(CliRun, PlainModeStreamsOutputAndExitsWithThePayloadsCode) {
  auto out =
      cli({"run", "--policy", "trusted-local", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3"});
  EXPECT_EQ(out.exit_code, 3);
  EXPECT_EQ(out.out, "hi\n");
  EXPECT_EQ(out.err, "oops\n");
}

TEST(CliRun, CodeFlagRunsPython) {
  auto out = cli({"run", "--policy", "trusted-local", "--json", "--code", "print(6 * 7)"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(json::parse(out.out)["stdout"], "42\n");
}

TEST(CliRun, StdinIsForwarded) {
  ProcessOptions options;
  options.stdin_data = "line one\nline two\n";
  auto out = cli({"run", "--policy", "trusted-local", "--", "wc", "-l"}, options);
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "2\n");
}

TEST(CliRun, EnvFlagSetsVariablesOnAClearedEnvironment) {
  ProcessOptions options;
  options.extra_env["RLM_TEST_SECRET"] = "host-only";
  auto out =
      cli({"run", "--policy", "trusted-local", "--env", "GREETING=hello", "--", "env"}, options);
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_NE(out.out.find("GREETING=hello\n"), std::string::npos) << out.out;
  EXPECT_EQ(out.out.find("RLM_TEST_SECRET"), std::string::npos) << "host variable leaked";
}

TEST(CliRun, SignalDeathExitsWith128PlusSignal) {
  auto out = cli({"run", "--policy", "trusted-local", "--json", "--", "sh", "-c", "kill -SEGV $$"});
  EXPECT_EQ(out.exit_code, 128 + 11);
  auto result = json::parse(out.out);
  EXPECT_EQ(result["status"], "signaled");
  EXPECT_EQ(result["signal"], 11);
}

TEST(CliRun, MissingCommandExits127AndUnexecutableExits126) {
  auto missing = cli({"run", "--policy", "trusted-local", "--", "no-such-command-rlm"});
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_NE(missing.err.find("no-such-command-rlm"), std::string::npos) << missing.err;

  TempDir dir;
  dir.write("script", "#!/bin/sh\necho never\n");  // not executable
  auto denied = cli({"run", "--policy", "trusted-local", "--", dir.file("script")});
  EXPECT_EQ(denied.exit_code, 126);
  EXPECT_EQ(denied.out, "");
}

// A payload that double-forks a setsid() grandchild must not outlive its timeout.
TEST(CliRun, TimeoutKillsASetsidGrandchild) {
  TempDir dir;
  const std::string script =
      "setsid sh -c 'echo $$ > " + dir.file("grandchild.pid") + "; exec sleep 60' & sleep 60";
  auto out = cli({"run", "--policy", "trusted-local", "--timeout", "1s", "--", "sh", "-c", script});
  EXPECT_EQ(out.exit_code, 124) << out.err;
  EXPECT_LT(out.wall.count(), 2000) << "the CLI took " << out.wall.count() << " ms";
  EXPECT_NE(out.err.find("timeout"), std::string::npos) << out.err;
  const pid_t grandchild = std::stoi(dir.read("grandchild.pid"));
  ASSERT_GT(grandchild, 1);
  EXPECT_FALSE(process_alive(grandchild)) << "setsid grandchild " << grandchild << " survived";
}

TEST(CliRun, OutputFloodIsCutAtTheCapWithBoundedMemory) {
  // trusted-local caps each stream at 1 MiB.
  auto out = cli({"run", "--policy", "trusted-local", "--json", "--", "head", "-c", "1073741824",
                  "/dev/zero"});
  auto result = json::parse(out.out);
  EXPECT_EQ(result["status"], "output_limit");
  EXPECT_EQ(result["stdout"].get<std::string>().size(), 1u << 20);
  EXPECT_EQ(result["stdout_truncated"], true);
  EXPECT_EQ(result["stderr_truncated"], false);
  // Promptly: far less than writing 1 GiB through a pipe and JSON would take.
  EXPECT_LT(out.wall.count(), 10'000);
  // The bound is what shows the 1 GiB was never held: 64 MiB for the real binary. An ASan build
  // of the CLI (linked with libcurl) starts at about 80 MiB of shadow memory and quarantine.
#ifdef RLM_TEST_SANITIZED
  constexpr std::uint64_t kRssBound = 192u << 20;
#else
  constexpr std::uint64_t kRssBound = 64u << 20;
#endif
  EXPECT_LT(out.max_rss_bytes, kRssBound)
      << "the CLI (or its payload) grew to " << out.max_rss_bytes << " bytes";
}

TEST(CliRun, ResultFileStreamsOutputAndWritesTheResult) {
  TempDir dir;
  auto out = cli({"run", "--policy", "trusted-local", "--result-file", dir.file("result.json"),
                  "--", "sh", "-c", "echo streamed; exit 5"});
  EXPECT_EQ(out.exit_code, 5);
  EXPECT_EQ(out.out, "streamed\n");
  auto result = json::parse(dir.read("result.json"));
  EXPECT_EQ(result["status"], "exit_nonzero");
  EXPECT_EQ(result["exit_code"], 5);
  EXPECT_EQ(result["stdout"], "") << "streamed output is not kept twice";
}

// The result file's directory may be the payload's output directory: nothing is written through a
// name a payload planted there (a link from an earlier run at the old PATH.tmp, or at PATH), and
// the file has no name the payload could see or replace while it runs.
TEST(CliRun, AResultFileIsNeverWrittenThroughALinkAPayloadPlanted) {
  TempDir dir;
  const std::string out = dir.file("out");
  std::filesystem::create_directory(out);
  dir.write("victim", "the host's own\n");
  dir.write("victim2", "the host's own too\n");
  auto plant = cli({"run", "-q", "--bind", out + ":/out", "--", "sh", "-c",
                    "ln -s " + dir.file("victim") + " /out/result.json.tmp && ln -s " +
                        dir.file("victim2") + " /out/result.json"});
  ASSERT_EQ(plant.exit_code, 0) << plant.err;
  auto run = cli({"run", "-q", "--bind", out + ":/out", "--result-file", out + "/result.json", "--",
                  "sh", "-c", "ls -A /out"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "result.json\nresult.json.tmp\n") << "the payload saw the result file";
  EXPECT_EQ(dir.read("victim"), "the host's own\n");
  EXPECT_EQ(dir.read("victim2"), "the host's own too\n");
  EXPECT_FALSE(std::filesystem::is_symlink(out + "/result.json"));
  EXPECT_EQ(json::parse(dir.read("out/result.json"))["status"], "ok");
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(out)) ++entries;
  EXPECT_EQ(entries, 2u) << "a stray file was left in " << out;
}

TEST(CliRun, IsolatingPolicyFailsClosedOnTheLocalBackend) {
  auto out = cli({"run", "--policy", "default", "--backend", "local", "--", "true"});
  EXPECT_EQ(out.exit_code, 125);
  EXPECT_NE(out.err.find("allow_unisolated"), std::string::npos) << out.err;
  EXPECT_EQ(out.out, "");
}

TEST(CliRun, AutoSelectionNeverDropsToLocal) {
  TempDir dir;
  // An isolating policy that names local anyway is refused before anything runs.
  dir.write("p.json", R"({"extends": "default", "backend": {"prefer": ["local"]}})");
  auto out = cli({"run", "--policy", dir.file("p.json"), "--", "sh", "-c", "echo ran"});
  EXPECT_EQ(out.exit_code, 125);
  EXPECT_EQ(out.out, "");
  EXPECT_NE(out.err.find("allow_unisolated"), std::string::npos) << out.err;

  // An isolating policy whose backends are missing fails closed with what is missing.
  dir.write("docker-only.json", R"({"extends": "default", "backend": {"prefer": ["docker"]}})");
  ProcessOptions no_daemon;  // even where a Docker daemon runs
  no_daemon.extra_env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock";
  auto missing = cli(
      {"run", "--policy", dir.file("docker-only.json"), "--", "sh", "-c", "echo ran"}, no_daemon);
  EXPECT_EQ(missing.exit_code, 125);
  EXPECT_EQ(missing.out, "");
  EXPECT_NE(missing.err.find("no backend can run"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("docker:"), std::string::npos) << missing.err;
}

TEST(CliRun, LimitFlagsMayOnlyTighten) {
  auto looser = cli({"run", "--policy", "trusted-local", "--timeout", "1h", "--", "true"});
  EXPECT_EQ(looser.exit_code, 125);
  EXPECT_TRUE(one_line(looser.err)) << looser.err;
  EXPECT_NE(looser.err.find("wall_time_ms"), std::string::npos) << looser.err;

  auto tighter =
      cli({"run", "--policy", "trusted-local", "--json", "--timeout", "300ms", "--", "sleep", "5"});
  EXPECT_EQ(tighter.exit_code, 124);
  EXPECT_EQ(json::parse(tighter.out)["status"], "timeout");

  // --cpus narrows limits.cpus; a policy that sets one cannot be widened.
  TempDir dir;
  dir.write("half.json", R"({"extends": "trusted-local", "limits": {"cpus": 0.5}})");
  auto wider = cli({"run", "--policy", dir.file("half.json"), "--cpus", "2", "--", "true"});
  EXPECT_EQ(wider.exit_code, 125);
  EXPECT_TRUE(one_line(wider.err)) << wider.err;
  EXPECT_NE(wider.err.find("--cpus 2 exceeds the policy's limits.cpus (0.5)"), std::string::npos)
      << wider.err;
  auto narrower =
      cli({"run", "--policy", dir.file("half.json"), "--cpus", "0.25", "--json", "--", "true"});
  EXPECT_EQ(narrower.exit_code, 0) << narrower.err;
  // The local backend cannot hold a bandwidth, and says so.
  const auto unenforced = json::parse(narrower.out)["unenforced"];
  EXPECT_NE(std::find(unenforced.begin(), unenforced.end(), "limits.cpus"), unenforced.end())
      << narrower.out;
}

TEST(CliRun, BadInputGivesOneLineAndTheRightStatus) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string mentions;
  };
  TempDir dir;
  dir.write("malformed.json", "{\n  \"limits\": {\"pids\": 4,}\n}\n");
  const std::vector<Case> cases = {
      {{"run", "--no-such-flag", "--", "true"}, 2, "no-such-flag"},
      {{"run", "--policy", "trusted-local"}, 2, "no command"},
      {{"run", "--policy", "trusted-local", "--json", "--result-file", "x", "--", "true"},
       2,
       "--result-file"},
      {{"run", "--policy", "trusted-local", "--memory", "12X", "--", "true"}, 2, "12X"},
      {{"run", "--policy", "trusted-local", "--timeout", "soon", "--", "true"}, 2, "soon"},
      {{"run", "--policy", "trusted-local", "--pids", "-1", "--", "true"}, 2, "--pids"},
      {{"run", "--policy", "trusted-local", "--cpus", "half", "--", "true"}, 2, "--cpus 'half'"},
      {{"run", "--policy", "trusted-local", "--cpus", "0", "--", "true"}, 2, "--cpus '0'"},
      {{"run", "--policy", "trusted-local", "--cpus", "1e3", "--", "true"}, 2, "--cpus"},
      {{"run", "--policy", "trusted-local", "--bind", "/no/such/path", "--", "true"},
       125,
       "/no/such/path"},
      {{"run", "--policy", "trusted-local", "--env", "=x", "--", "true"}, 2, "--env =x"},
      {{"run", "--policy", "trusted-local", "--network", "some", "--", "true"}, 2, "'some'"},
      {{"run", "--policy", "trusted-local", "--env-file", "/no/such/file", "--", "true"},
       125,
       "/no/such/file"},
      {{"run", "--policy", "trusted-local", "--language", "cobol", "--code", "x"}, 2, "cobol"},
      {{"run", "--policy", dir.file("missing.json"), "--", "true"}, 125, "missing.json"},
      {{"run", "--policy", dir.file("malformed.json"), "--", "true"}, 125, "line 2"},
      {{"run", "--backend", "podman", "--", "true"}, 2, "podman"},
      {{"run", "--policy", "trusted-local", "--memory", "512", "--", "true"}, 2, "512M"},
      {{"run", "--policy", "trusted-local", "--bind", "/tmp:/x:rx", "--", "true"}, 2, "'rx'"},
      {{"run", "--policy", "trusted-local", "--bind", "/tmp:/x:y:ro", "--", "true"}, 2, "':'"},
      {{"run", "--policy", "trusted-local", "--bind-ro", "/tmp:/x:rw", "--", "true"}, 2, ":rw"},
      {{"run", "--policy", "trusted-local", "--tmpfs", "/x:y:1M", "--", "true"}, 2, "':'"},
      {{"frobnicate"}, 2, "frobnicate"},
  };
  for (const auto& c : cases) {
    auto out = cli(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_EQ(out.exit_code, c.exit_code) << shown << "\n" << out.err;
    EXPECT_TRUE(one_line(out.err)) << shown << "\n" << out.err;
    EXPECT_NE(out.err.find(c.mentions), std::string::npos) << shown << "\n" << out.err;
    EXPECT_EQ(out.err.find("terminate called"), std::string::npos) << out.err;
  }
}

// A value that cannot mean anything is a usage error (2); one the policy or the host refuses is a
// setup error (125). See BadInputGivesOneLineAndTheRightStatus for the list.

// Options end at the first word that is not an option (or at "--"): the command's own options are
// its own. Before, `run ls -la /` took -la as "--language a" and listed / without -la, and
// `run python3 -c 'print(1)'` failed.
TEST(CliRun, OptionsEndAtTheCommand) {
  auto listed = cli({"run", "--policy", "trusted-local", "ls", "-la", "/"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(listed.out.rfind("total ", 0), 0u) << "ls -l's first line:\n" << listed.out;
  EXPECT_NE(listed.out.find(" ..\n"), std::string::npos) << "-a lists ..:\n" << listed.out;

  auto python = cli({"run", "--policy", "trusted-local", "python3", "-c", "print(1)"});
  EXPECT_EQ(python.exit_code, 0) << python.err;
  EXPECT_EQ(python.out, "1\n");

  // Words after the command that look like ours are the command's; an option's value that starts
  // with '-' is still the option's.
  auto echoed = cli({"run", "--policy", "trusted-local", "--env", "X=-json", "sh", "-c",
                     "echo \"$X $0 $1\"", "--json", "--timeout"});
  EXPECT_EQ(echoed.exit_code, 0) << echoed.err;
  EXPECT_EQ(echoed.out, "-json --json --timeout\n");
  // "--" still ends the options, and is not passed on.
  auto dashed = cli({"run", "--policy", "trusted-local", "--", "echo", "--", "x"});
  EXPECT_EQ(dashed.out, "-- x\n") << dashed.err;
}

// Mounts apply in the order given (bwrap's rule), after the policy's: a writable directory may sit
// inside a read-only one. Before, every --bind came before every --bind-ro, so this failed in
// either order. Through the namespace backend (the default policy), whose mounts are real.
TEST(CliRun, MountsApplyInTheOrderGiven) {
  TempDir dir;
  dir.write("input.txt", "data\n");
  const std::string out = dir.file("out");
  std::filesystem::create_directory(out);
  // Readable by all: under a root runtime a read-only bind is read as the sandbox's own uid.
  // out/ keeps its owner's modes: a writable bind is idmapped to the caller.
  std::filesystem::permissions(
      dir.path(), std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                      std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                      std::filesystem::perms::others_exec);
  std::filesystem::permissions(out, std::filesystem::perms::owner_all);
  auto run = cli({"run", "--bind-ro", dir.path() + ":/work", "--bind", out + ":/work/out", "-w",
                  "/work", "sh", "-c",
                  "cat input.txt && echo written > out/result && ! touch not-here 2>/dev/null"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "data\n");
  EXPECT_EQ(dir.read("out/result"), "written\n");
  EXPECT_FALSE(std::filesystem::exists(dir.file("not-here")));

  // The other order would hide the writable one: refused, in the flags' words.
  auto hidden =
      cli({"run", "--bind", out + ":/work/out", "--bind-ro", dir.path() + ":/work", "--", "true"});
  EXPECT_EQ(hidden.exit_code, 2);
  EXPECT_TRUE(one_line(hidden.err)) << hidden.err;
  EXPECT_NE(hidden.err.find("mounts apply in the order given"), std::string::npos) << hidden.err;
}

// A writable bind is idmapped to the caller under a root runtime. Where this host cannot idmap it
// (here a ramfs mounted below it), root's run goes on as before idmapping -- the sandbox writes as
// its own uid where the modes let anyone, and an inert uid, never root, gets what it wrote -- and
// the CLI says so, with the fix. (A client of another uid is refused instead:
// ServerTenant.AClientsBindThatCannotBeIdmappedIsRefusedBeforeTheRunWithTheFix.)
TEST(CliRun, WhereABindCannotBeIdmappedRootsRunSaysSoAndNothingBecomesRoots) {
  if (geteuid() != 0) GTEST_SKIP() << "only a root runtime idmaps its binds";
  TempDir dir;
  std::filesystem::permissions(dir.path(), std::filesystem::perms::all);
  const std::string below = dir.file("ramfs");
  std::filesystem::create_directory(below);
  // ramfs cannot be idmapped; mounted in a mount namespace of the test's own, gone with it.
  const std::string script = "mount --make-rprivate / && mount -t ramfs none " + below +
                             " && exec " + bin_path("rlm-sandbox") + " run --bind " + dir.path() +
                             ":/out -- sh -c 'echo x > /out/made'";
  const std::string unshare = access("/usr/bin/unshare", X_OK) == 0 ? "/usr/bin/unshare" : "";
  if (unshare.empty()) GTEST_SKIP() << "util-linux's unshare is not installed";
  const auto run = run_process({unshare, "--mount", "/bin/sh", "-c", script});
  if (run.exit_code != 0 && (run.err.rfind("unshare:", 0) == 0 || run.err.rfind("mount:", 0) == 0))
    GTEST_SKIP() << "no mount namespace of its own for the test here: " << run.err;
  EXPECT_EQ(run.exit_code, 0) << run.err;
  for (const std::string& words :
       std::vector<std::string>{"note: this host cannot idmap the read-write binds",
                                "now belongs to uid 1879113728, not root", "bind a directory on"})
    EXPECT_NE(run.err.find(words), std::string::npos) << words << "\n" << run.err;
  struct stat st {};
  ASSERT_EQ(lstat(dir.file("made").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0x70010000u) << "what the sandbox wrote is not the output uid's";
}

// docker's -v habit: SRC:DST:ro and :rw choose the mode (and -v is --bind). Before, the suffix
// became part of the target: a read-write mount at "/data:ro".
TEST(CliRun, DockerStyleModeSuffixesChooseTheMode) {
  TempDir dir;
  dir.write("input.txt", "data\n");
  std::filesystem::permissions(dir.path(), std::filesystem::perms::all);
  for (const std::string flag : {"-v", "--volume", "--bind"}) {
    auto readonly = cli({"run", flag, dir.path() + ":/data:ro", "sh", "-c",
                         "cat /data/input.txt; touch /data/new; ls -d /data:ro 2>&1"});
    EXPECT_NE(readonly.exit_code, 0) << flag;
    EXPECT_EQ(readonly.out.rfind("data\n", 0), 0u) << flag << ": " << readonly.out;
    EXPECT_NE(readonly.err.find("Read-only file system"), std::string::npos)
        << flag << ": " << readonly.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("new"))) << flag;

    auto writable =
        cli({"run", flag, dir.path() + ":/data:rw", "--", "touch", "/data/new-" + flag});
    EXPECT_EQ(writable.exit_code, 0) << flag << ": " << writable.err;
    EXPECT_TRUE(std::filesystem::exists(dir.file("new-" + flag))) << flag;
  }
  // SRC:ro binds SRC at its own path, read-only.
  auto own_path = cli({"run", "--bind", dir.path() + ":ro", "--", "cat", dir.file("input.txt")});
  EXPECT_EQ(own_path.exit_code, 0) << own_path.err;
  EXPECT_EQ(own_path.out, "data\n");
}

// A bare duration is seconds (timeout(1)'s and nsjail's reading), not milliseconds; a bare size
// is refused with the units to use, not taken as bytes.
TEST(CliRun, BareDurationsAreSecondsAndSizesNeedAUnit) {
  auto timed =
      cli({"run", "--policy", "trusted-local", "--json", "--timeout", "1", "--", "sleep", "30"});
  EXPECT_EQ(timed.exit_code, 124) << timed.err;
  const auto result = json::parse(timed.out);
  EXPECT_EQ(result["status"], "timeout");
  // 1 s, not 1 ms (a lower bound: a loaded machine only makes it longer).
  EXPECT_GE(result["wall_ms"].get<double>(), 950.0) << timed.out;

  auto bare = cli({"run", "--policy", "trusted-local", "--memory", "512", "--", "true"});
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_TRUE(one_line(bare.err)) << bare.err;
  EXPECT_NE(bare.err.find("512M"), std::string::npos) << bare.err;
  auto bytes =
      cli({"run", "--policy", "trusted-local", "--memory", "100000000B", "--json", "--", "true"});
  EXPECT_EQ(bytes.exit_code, 0) << bytes.err;
}

// --json and --result-file give a Result for every failure, also one found before the run; the
// result file is created before the payload starts, so a path that cannot be written stops the
// command before it runs anything.
TEST(CliRun, FailuresBeforeTheRunYieldAResult) {
  TempDir dir;
  struct Case {
    std::vector<std::string> flags;
    int exit_code;
    std::string mentions;
  };
  for (const auto& c :
       std::vector<Case>{{{"--memory", "512"}, 2, "512M"},
                         {{"--no-such-flag"}, 2, "no-such-flag"},
                         {{"--policy", dir.file("missing.json")}, 125, "missing.json"},
                         {{"--policy", "trusted-local", "--timeout", "1h"}, 125, "wall_time_ms"}}) {
    std::vector<std::string> words{"run", "--json"};
    words.insert(words.end(), c.flags.begin(), c.flags.end());
    words.insert(words.end(), {"--", "true"});
    const auto out = cli(words);
    EXPECT_EQ(out.exit_code, c.exit_code) << c.mentions << ": " << out.err;
    EXPECT_TRUE(one_line(out.err)) << out.err;
    const auto result = json::parse(out.out, nullptr, false);
    ASSERT_TRUE(result.is_object()) << c.mentions << ": stdout is not a Result: " << out.out;
    EXPECT_EQ(result["status"], "sandbox_error");
    EXPECT_NE(result["detail"].get<std::string>().find(c.mentions), std::string::npos)
        << result.dump();

    std::vector<std::string> to_file{"run", "--result-file", dir.file("result.json")};
    to_file.insert(to_file.end(), c.flags.begin(), c.flags.end());
    to_file.insert(to_file.end(), {"--", "true"});
    std::filesystem::remove(dir.file("result.json"));
    EXPECT_EQ(cli(to_file).exit_code, c.exit_code);
    const auto written = json::parse(dir.read("result.json"), nullptr, false);
    ASSERT_TRUE(written.is_object()) << c.mentions;
    EXPECT_EQ(written["status"], "sandbox_error");
    EXPECT_FALSE(std::filesystem::exists(dir.file("result.json.tmp")));
  }

  // An unwritable result file: the payload never starts.
  const auto unwritable =
      cli({"run", "--policy", "trusted-local", "--result-file", dir.file("no/such/dir/result.json"),
           "--", "touch", dir.file("ran")});
  EXPECT_EQ(unwritable.exit_code, 125);
  EXPECT_NE(unwritable.err.find("--result-file"), std::string::npos) << unwritable.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("ran"))) << "the payload ran";
}

// SIGINT, SIGTERM and SIGHUP to the CLI stop the run the way a timeout does: the payload gets
// SIGTERM and its grace (its handler runs and its output arrives), the Result says interrupted and
// names the signal, and the exit status is 128+N. Before, the CLI died of the signal with no
// Result. Through the namespace backend (the default policy); ServerRunTest has the server's.
TEST(CliRun, ASignalStopsThePayloadGracefullyAndEndsInterrupted) {
  const std::string payload =
      "trap 'echo got TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done";
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    RunningCli run({"run", "--json", "--", "sh", "-c", payload});
    ASSERT_GT(run.pid(), 0);
    // --json holds the output until the end: wait for the payload through its process instead.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    kill(run.pid(), signal);
    EXPECT_EQ(run.finish(), 128 + signal) << strsignal(signal) << ": " << run.out();
    const auto result = json::parse(run.out(), nullptr, false);
    ASSERT_TRUE(result.is_object()) << run.out();
    EXPECT_EQ(result["status"], "interrupted") << result.dump();
    EXPECT_EQ(result["signal"], signal) << result.dump();
    EXPECT_NE(result["stdout"].get<std::string>().find("got TERM"), std::string::npos)
        << "the payload's handler did not run: " << result.dump();
  }
  // Streamed: what the payload wrote after the signal still comes out.
  RunningCli streamed({"run", "--", "sh", "-c", payload});
  ASSERT_TRUE(streamed.wait_for("up\n"));
  kill(streamed.pid(), SIGINT);
  EXPECT_EQ(streamed.finish(), 130);
  EXPECT_EQ(streamed.out(), "up\ngot TERM\n");
}

// -e NAME takes this process's value (left out when it has none), --env-file reads NAME=VALUE
// lines (comments and blank lines skipped), and --env wins over a file.
TEST(CliRun, EnvFlagsTakeTheCallersValueAndFiles) {
  TempDir dir;
  dir.write("env", "# settings\n\nFROM_FILE=1\nBOTH=file\nRLM_TEST_PASSED\n");
  ProcessOptions options;
  options.extra_env["RLM_TEST_PASSED"] = "from the caller";
  auto out =
      cli({"run", "--policy", "trusted-local", "-e", "RLM_TEST_PASSED", "-e",
           "RLM_TEST_UNSET_ANYWHERE", "--env-file", dir.file("env"), "-e", "BOTH=flag", "env"},
          options);
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_NE(out.out.find("RLM_TEST_PASSED=from the caller\n"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("FROM_FILE=1\n"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("BOTH=flag\n"), std::string::npos) << out.out;
  EXPECT_EQ(out.out.find("RLM_TEST_UNSET_ANYWHERE"), std::string::npos) << out.out;
}

// --hostname names the sandbox; --network may only tighten: host to none, never none to host.
// --allow-net narrows the policy's network to an allowlist and never widens it; the allowlist is
// enforced, and what it denied is shown on stderr.
TEST(CliRun, AllowNetOnlyNarrowsAndTheAllowlistIsEnforcedWithItsDenialsShown) {
  TempDir dir;
  dir.write("host.json",
            R"({"extends": "default", "network": "host", "namespaces": {"net": false}})");
  dir.write("listed.json", R"({"extends": "default", "network": {"allow": ["pypi.org:443"]}})");
  const std::string ran = dir.file("ran");
  const auto run_with = [&](std::vector<std::string> flags) {
    std::vector<std::string> args = {"run", "-q"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "touch", ran});
    return cli(args);
  };
  const auto none = run_with({"--allow-net", "pypi.org:443"});
  EXPECT_EQ(none.exit_code, 125);
  EXPECT_NE(none.err.find("the policy's network is none"), std::string::npos) << none.err;
  const auto malformed = run_with({"--allow-net", "pypi.org"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_NE(malformed.err.find("needs a port"), std::string::npos) << malformed.err;
  const auto wider =
      run_with({"--policy", dir.file("listed.json"), "--allow-net", "other.org:443"});
  EXPECT_EQ(wider.exit_code, 125);
  EXPECT_NE(wider.err.find("not within the policy's allowlist"), std::string::npos) << wider.err;
  EXPECT_FALSE(std::filesystem::exists(ran)) << "a refused payload ran";

  // Enforced: the sandbox's DNS answers the allowed name (a synthetic address, asked of no
  // resolver) and nothing else, and the denial is printed on stderr, escaped.
  const std::string lookup =
      "import socket\n"
      "print(socket.gethostbyname('pypi.org').startswith('198.18.'))\n"
      "try:\n  socket.gethostbyname('evil.org')\nexcept OSError:\n  print('nxdomain')\n";
  for (const auto& flags :
       {std::vector<std::string>{"--policy", dir.file("host.json"), "--allow-net", "pypi.org:443"},
        std::vector<std::string>{"--policy", dir.file("listed.json")}}) {
    std::vector<std::string> args = {"run"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "python3", "-c", lookup});
    const auto enforced = cli(args);
    EXPECT_EQ(enforced.exit_code, 0) << enforced.err;
    EXPECT_EQ(enforced.out, "True\nnxdomain\n") << enforced.err;
    EXPECT_NE(enforced.err.find("network: denied (dns) evil.org"), std::string::npos)
        << enforced.err;
  }
}

TEST(CliRun, HostnameAndNetworkFlags) {
  auto named = cli({"run", "--hostname", "box-7", "--", "hostname"});
  EXPECT_EQ(named.exit_code, 0) << named.err;
  EXPECT_EQ(named.out, "box-7\n");

  auto loosened = cli({"run", "--network", "host", "--", "true"});
  EXPECT_EQ(loosened.exit_code, 125);
  EXPECT_NE(loosened.err.find("may only tighten"), std::string::npos) << loosened.err;

  TempDir dir;
  dir.write("host-net.json",
            R"({"extends": "default", "network": "host", "namespaces": {"net": false}})");
  const std::vector<std::string> list = {
      "--", "sh", "-c", "sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '"};
  std::vector<std::string> on_host{"run", "--policy", dir.file("host-net.json")};
  on_host.insert(on_host.end(), list.begin(), list.end());
  std::vector<std::string> tightened{"run", "--policy", dir.file("host-net.json"), "--network",
                                     "none"};
  tightened.insert(tightened.end(), list.begin(), list.end());
  const auto host = cli(on_host);
  const auto none = cli(tightened);
  EXPECT_EQ(host.exit_code, 0) << host.err;
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out, "lo ") << "only loopback in a network namespace of its own";
  EXPECT_NE(host.out, "lo ") << "the host's interfaces: " << host.out;
}

// --quiet drops the notes about limits held by a stand-in (the rootless note is ~900
// characters on every run): made here by running the CLI as uid 65534, who has no cgroup.
TEST(CliRun, QuietDropsTheNotes) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the CLI as uid 65534";
  const auto as_nobody = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", bin_path("rlm-sandbox")});
    ProcessOptions options;
    options.workdir = "/";
    return run_process(args, options);
  };
  const auto noted = as_nobody({"run", "--", "true"});
  ASSERT_EQ(noted.exit_code, 0) << noted.err;
  if (noted.err.find("note:") == std::string::npos)
    GTEST_SKIP() << "uid 65534 has a cgroup here: no note to drop";
  const auto quiet = as_nobody({"run", "-q", "--", "true"});
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

// -t gives the payload a terminal: it is a tty on 0-2 and leads a session with it as its
// controlling terminal. Before, `rlm-sandbox run -- python3` in a terminal showed no prompt.
TEST(CliRun, TtyGivesThePayloadATerminal) {
  auto out = cli({"run", "-t", "--", "python3", "-c",
                  "import os, sys; print(sys.stdin.isatty(), sys.stdout.isatty(), "
                  "sys.stderr.isatty(), os.getsid(0) == os.getpid())"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "True True True True\r\n") << "through the terminal: \\n is \\r\\n";
  auto refused = cli({"run", "-t", "--json", "--", "true"});
  EXPECT_EQ(refused.exit_code, 2);
}

// The terminal a person types at, played by the test: a pseudo-terminal whose other side becomes
// the CLI's controlling terminal and stdio (stdout elsewhere when `out` >= 0).
class PersonsTerminal {
 public:
  PersonsTerminal() {
    primary_ = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (primary_ >= 0 && grantpt(primary_) == 0 && unlockpt(primary_) == 0)
      replica_ = ptsname(primary_);
  }
  ~PersonsTerminal() {
    if (primary_ >= 0) close(primary_);
  }
  PersonsTerminal(const PersonsTerminal&) = delete;
  PersonsTerminal& operator=(const PersonsTerminal&) = delete;

  int fd() const { return primary_; }
  bool ready() const { return !replica_.empty(); }

  // Starts `rlm-sandbox ARGS...` with this terminal as its own.
  pid_t start(const std::vector<std::string>& args, int out = -1) const {
    std::vector<std::string> words{bin_path("rlm-sandbox")};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      setsid();
      const int terminal = open(replica_.c_str(), O_RDWR);  // the controlling terminal now
      if (terminal < 0) _exit(126);
      dup2(terminal, 0);
      dup2(out >= 0 ? out : terminal, 1);
      dup2(terminal, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  }

 private:
  int primary_ = -1;
  std::string replica_;
};

// -it from a terminal, as a person uses it: what they type reaches the payload's terminal (raw
// mode here, so Ctrl-C is a key the payload's terminal turns into SIGINT for its foreground job,
// not a signal to the CLI), the window size is passed on, and the payload's exit status is the
// CLI's. The test plays the person's terminal with a pseudo-terminal of its own.
TEST(CliRun, InteractiveTtyPassesKeysSizeAndControlC) {
  const PersonsTerminal person;
  ASSERT_TRUE(person.ready());
  const int outer = person.fd();
  winsize size{};
  size.ws_row = 33;
  size.ws_col = 77;
  ASSERT_EQ(ioctl(outer, TIOCSWINSZ, &size), 0);
  const pid_t pid = person.start({"run", "-it", "--", "sh"});
  std::string seen;
  const auto wait_for = [&](const std::string& text) {
    return read_until(outer, seen, text, std::chrono::seconds(30));
  };
  const auto type = [&](const std::string& keys) {
    ASSERT_EQ(write(outer, keys.data(), keys.size()), static_cast<ssize_t>(keys.size()));
  };
  EXPECT_TRUE(wait_for("$ ")) << "no prompt: " << seen;
  type("stty size; echo answer-$((6 * 7))\n");
  EXPECT_TRUE(wait_for("answer-42")) << seen;
  EXPECT_NE(seen.find("33 77"), std::string::npos) << "the window size: " << seen;
  type("sleep 60; echo slept-through\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  type("\x03");  // Ctrl-C: the foreground sleep dies, the shell prompts again
  type("echo after-$((1 + 1))\n");
  EXPECT_TRUE(wait_for("after-2")) << seen;
  EXPECT_EQ(seen.find("\nslept-through"), std::string::npos)
      << "the sleep was not stopped: " << seen;
  type("exit 3\n");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status << "\n" << seen;
}

// A CLI that dies of a signal while its terminal is raw puts the terminal back first. A payload
// that floods a closed stdout made the CLI die of SIGPIPE, and the person's terminal stayed raw
// (found by attacking it).
TEST(CliRun, ADeathBySignalLeavesTheTerminalAsItWas) {
  const PersonsTerminal person;
  ASSERT_TRUE(person.ready());
  int closed_out[2];  // a reader that has gone: the CLI's first write is SIGPIPE
  ASSERT_EQ(pipe2(closed_out, O_CLOEXEC), 0);
  const pid_t pid = person.start({"run", "-it", "--", "sh", "-c", "yes | head -c 300000; sleep 2"},
                                 closed_out[1]);
  close(closed_out[0]);
  close(closed_out[1]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE) << status;
  termios modes{};
  ASSERT_EQ(tcgetattr(person.fd(), &modes), 0);
  EXPECT_TRUE(modes.c_lflag & ICANON) << "left raw";
  EXPECT_TRUE(modes.c_lflag & ECHO) << "left raw";
  EXPECT_TRUE(modes.c_lflag & ISIG) << "left raw";
}

TEST(CliRun, HelpTeachesWithExamples) {
  for (std::vector<std::string> args : {std::vector<std::string>{"run", "--help"},
                                        {"health", "--help"},
                                        {"policy", "--help"},
                                        {"--help"}}) {
    auto out = cli(args);
    EXPECT_EQ(out.exit_code, 0) << args.front();
    EXPECT_NE(out.out.find("examples:"), std::string::npos) << args.front() << "\n" << out.out;
  }
  auto run_help = cli({"run", "--help"});
  for (const char* flag : {"--policy",
                           "--backend",
                           "--timeout",
                           "--memory",
                           "--bind-ro",
                           "--tmpfs",
                           "--json",
                           "--result-file",
                           "124",
                           "125",
                           "127",
                           "--volume",
                           "--env-file",
                           "--hostname",
                           "--network",
                           "--quiet",
                           "in the order given",
                           ":ro",
                           "seconds",
                           "SIGINT",
                           "interrupted",
                           "128+N"})
    EXPECT_NE(run_help.out.find(flag), std::string::npos) << flag;
  // `help COMMAND` is `COMMAND --help`, and the overview names --version.
  EXPECT_EQ(cli({"help", "run"}).out, run_help.out);
  EXPECT_NE(cli({"--help"}).out.find("--version"), std::string::npos);
  EXPECT_EQ(cli({"help", "frobnicate"}).exit_code, 2);
}

}  // namespace
}  // namespace rlm::test
