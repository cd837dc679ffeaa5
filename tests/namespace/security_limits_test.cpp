// Resource attacks against the default sandbox on the namespace backend: memory, processes, time,
// and processes that try to outlive their run. These run serially (see security_tests.cmake):
// they load the machine and some of them assert deadlines.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>

#include "exit_status.hpp"
#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// A 1 GiB balloon whose every page is touched.
const char* const kBalloon = R"PY(
b = bytearray(1 << 30)
for i in range(0, len(b), 4096):
    b[i] = 1
print('survived', len(b))
)PY";

bool lists(const std::vector<std::string>& fields, const std::string& field) {
  return std::find(fields.begin(), fields.end(), field) != fields.end();
}

TEST_F(NamespaceTest, MemoryBalloonEndsInMemoryLimitNearTheLimit) {
  Policy policy = policy_;
  policy.limits.memory_bytes = 64 * kMiB;
  auto result = python(kBalloon, policy);
  EXPECT_EQ(result.stdout_data.find("survived"), std::string::npos) << describe(result);
  if (!test::lane_has_cgroups()) {
    // The documented fallback: RLIMIT_AS refuses the allocation, and the Result says the memory
    // limit did not hold as a memory limit.
    EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);
    EXPECT_NE(result.stderr_data.find("MemoryError"), std::string::npos) << describe(result);
    EXPECT_EQ(result.unenforced,
              (std::vector<std::string>{"limits.memory_bytes", "limits.cpu_time_ms"}));
    EXPECT_NE(result.detail.find("RLIMIT_AS"), std::string::npos) << describe(result);
    return;
  }
  EXPECT_EQ(result.status, Status::memory_limit) << describe(result);
  EXPECT_EQ(result.unenforced, std::vector<std::string>{}) << describe(result);
  EXPECT_GE(result.peak_memory_bytes, 48 * kMiB) << describe(result);
  EXPECT_LE(result.peak_memory_bytes, 80 * kMiB) << describe(result);
}

TEST_F(NamespaceTest, CliMemoryBalloonExits137WithMemoryLimit) {
  auto out = cli({"run", "--memory", "64M", "--json", "--", "python3", "-c", kBalloon});
  auto result = nlohmann::json::parse(out.out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out.out << out.err;
  EXPECT_EQ(result["backend"], "namespace") << out.out;
  if (!test::lane_has_cgroups()) {
    EXPECT_EQ(out.exit_code, 1) << out.err;
    EXPECT_EQ(result["status"], "exit_nonzero") << out.out;
    EXPECT_EQ(result["unenforced"],
              nlohmann::json::array({"limits.memory_bytes", "limits.cpu_time_ms"}))
        << out.out;
    return;
  }
  EXPECT_EQ(out.exit_code, 137) << out.err;
  EXPECT_EQ(result["status"], "memory_limit") << out.out;
  auto peak = result["peak_memory_bytes"].get<std::uint64_t>();
  EXPECT_GE(peak, 48 * kMiB) << out.out;
  EXPECT_LE(peak, 80 * kMiB) << out.out;
}

// Forks forever; failed forks are retried at once, so the tree stays at the limit and spins.
const char* const kForkBomb = R"PY(
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
)PY";

TEST_F(NamespaceTest, ForkBombEndsInPidsLimitAndTheHostStaysResponsive) {
  if (!backend_->isolated())
    GTEST_SKIP() << "refusing to fork-bomb the host through the unisolated " << backend_->name()
                 << " backend";
  Policy policy = policy_;
  policy.limits.pids = 32;
  auto bomb = std::async(std::launch::async, [&] {
    return python(kForkBomb, policy, std::chrono::milliseconds(5000));
  });

  // While it rages, the host still starts processes promptly.
  std::this_thread::sleep_for(1500ms);
  auto host = test::run_process({"/bin/true"});
  EXPECT_EQ(host.exit_code, 0);
  // A host the bomb had exhausted would not start it at all; 1 s was missed at 1.19 s in a VM
  // under load, so the bound allows for a loaded machine.
  EXPECT_LT(host.wall, 5000ms) << "the host stalled during the fork bomb";

  auto result = bomb.get();
  if (test::lane_has_cgroups()) {
    EXPECT_EQ(result.status, Status::pids_limit) << describe(result);
  } else {
    // RLIMIT_NPROC in the sandbox's user namespace held the tree at the limit (the host stayed
    // responsive above); the loop spun until its time was up.
    EXPECT_EQ(result.status, Status::timeout) << describe(result);
    EXPECT_NE(result.detail.find("RLIMIT_NPROC"), std::string::npos) << describe(result);
    EXPECT_FALSE(lists(result.unenforced, "limits.pids")) << describe(result);
  }

  // And right after it, a trivial sandboxed run succeeds promptly.
  auto after = cli({"run", "--", "true"});
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_LT(after.wall, 10000ms) << "a trivial run after the fork bomb was slow";
}

// Issue 11 line 15: RLIMIT_CPU resets with every process, so a chain of short-lived burners used
// 3.2 s of CPU under --cpu-time 1s. The sandbox's cgroup counts them together; without a cgroup
// (lane user-no-cgroup) RLIMIT_CPU per process is all there is, and the Result says so.
TEST_F(NamespaceTest, ChainOfShortBurnersCannotOutrunTheCpuTimeLimit) {
  auto out = cli({"run", "--policy", "python-repl", "--cpu-time", "1s", "--json", "--", "sh", "-c",
                  "for i in 1 2 3 4 5 6; do python3 -c 'import time\nt = "
                  "time.process_time()\nwhile time.process_time() - t < 0.6: pass'; done"});
  auto result = nlohmann::json::parse(out.out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out.out << out.err;
  const auto cpu_ms = result["cpu_ms"].get<double>();
  if (!test::lane_has_cgroups()) {
    EXPECT_TRUE(lists(result["unenforced"].get<std::vector<std::string>>(), "limits.cpu_time_ms"))
        << out.out;
    EXPECT_NE(result["detail"].get<std::string>().find("RLIMIT_CPU per process"), std::string::npos)
        << out.out;
    return;
  }
  EXPECT_EQ(result["status"], "cpu_limit") << out.out;
  EXPECT_EQ(out.exit_code, 128 + SIGXCPU) << out.err;
  EXPECT_GE(cpu_ms, 1000) << out.out;
  EXPECT_LE(cpu_ms, 1500) << out.out;
}

// --cpus 0.5: four burners for 1.5 s of wall time get half a CPU between them, not the machine.
TEST_F(NamespaceTest, CpusKeepsABurnerFromTakingTheMachine) {
  auto out = cli({"run", "--cpus", "0.5", "--json", "--", "sh", "-c",
                  "b() { timeout 1.5 sh -c 'while :; do :; done'; }; b & b & b & b & wait"});
  auto result = nlohmann::json::parse(out.out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out.out << out.err;
  if (!test::lane_has_cgroups()) {
    EXPECT_TRUE(lists(result["unenforced"].get<std::vector<std::string>>(), "limits.cpus"))
        << out.out;
    return;
  }
  EXPECT_EQ(result["status"], "ok") << out.out;
  EXPECT_EQ(result["unenforced"], nlohmann::json::array()) << out.out;
  const double cpu_ms = result["cpu_ms"], wall_ms = result["wall_ms"];
  EXPECT_GE(wall_ms, 1500) << out.out;
  EXPECT_LE(cpu_ms / wall_ms, 0.6) << out.out;
}

// The bounds say the timeout, not the payload, ended the run: at least the limit, and far below
// the payload's 60 s even on a loaded machine (other sandboxes run beside CI: 1211 ms was seen
// against a 1200 ms bound). How close to the limit a run ends is a benchmark's to measure.
constexpr auto kWellBeforeThePayloadEnds = 20s;

TEST_F(NamespaceTest, CliTimeoutExits124WithinTheDeadline) {
  auto out = cli({"run", "--timeout", "1s", "--", "sleep", "60"});
  EXPECT_EQ(out.exit_code, 124) << out.err;
  EXPECT_GE(out.wall, 1000ms);
  EXPECT_LT(out.wall, kWellBeforeThePayloadEnds)
      << "`sleep 60` under a 1s timeout took " << out.wall.count() << "ms";
}

TEST_F(NamespaceTest, TimeoutReportsStatusTimeout) {
  auto result = run({"sleep", "60"}, policy_, 1000ms);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_EQ(cli::exit_status(result), 124);
  EXPECT_GE(result.wall, std::chrono::microseconds(1000ms)) << describe(result);
  EXPECT_LT(result.wall, std::chrono::microseconds(kWellBeforeThePayloadEnds)) << describe(result);
}

TEST_F(NamespaceTest, CliTimeoutKillsAPayloadThatIgnoresSigterm) {
  auto out = cli({"run", "--timeout", "1s", "--", "sh", "-c", "trap '' TERM; sleep 60; :"});
  EXPECT_EQ(out.exit_code, 124) << out.err;
  EXPECT_LT(out.wall, kWellBeforeThePayloadEnds)
      << "a SIGTERM-ignoring payload took " << out.wall.count() << "ms";
}

// The payload double-forks a grandchild into its own session that ignores SIGTERM and SIGHUP,
// waits until the grandchild has announced itself through a read-write bind, and exits. The
// grandchild's command line carries `token`, which the host then looks for in every /proc entry.
std::string escaping_grandchild_script(const std::string& token) {
  return R"PY(
import os, time
sleeper = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\ntime.sleep(300)"
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        with open('/out/started', 'w') as f:
            f.write(str(os.getpid()))
        os.execv('/usr/bin/python3', ['python3', '-c', sleeper, ')PY" +
         token + R"PY('])
    os._exit(0)
os.waitpid(child, 0)
for _ in range(500):
    if os.path.exists('/out/started'):
        break
    time.sleep(0.01)
time.sleep(0.2)  # let the exec happen
print('started', os.path.exists('/out/started'))
)PY";
}

void expect_nothing_survives(const std::string& token) {
  auto survivors = processes_with_token(token);
  if (survivors.empty()) return;
  std::this_thread::sleep_for(1s);
  auto still = processes_with_token(token);
  ADD_FAILURE() << survivors.size() << " process(es) of the run were alive on the host after it "
                << "returned (host pid " << survivors.front() << "); one second later "
                << still.size() << " still were";
  for (pid_t pid : still) ::kill(pid, SIGKILL);  // leave nothing behind even when failing
}

TEST_F(NamespaceTest, SetsidDoubleForkLeavesNothingAlive) {
  SharedDir shared;
  const std::string token = "rlm-escapee-" + random_token();
  auto result =
      python(escaping_grandchild_script(token), with_rw_bind(shared.path(), "/out"), 10'000ms);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(parse_lines(result.stdout_data)["started"], "True") << describe(result);
  EXPECT_FALSE(shared.read("started").empty()) << "the grandchild never ran";
  expect_nothing_survives(token);
}

TEST_F(NamespaceTest, CliSetsidDoubleForkLeavesNothingAlive) {
  SharedDir shared;
  const std::string token = "rlm-escapee-" + random_token();
  auto out = cli({"run", "--bind", shared.path() + ":/out", "--", "python3", "-c",
                  escaping_grandchild_script(token)});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "started True\n");
  EXPECT_FALSE(shared.read("started").empty()) << "the grandchild never ran";
  expect_nothing_survives(token);
}

TEST_F(NamespaceTest, TimedOutRunLeavesNothingAlive) {
  // The same escape attempt, but the payload is still running when the wall timeout ends it.
  SharedDir shared;
  const std::string token = "rlm-escapee-" + random_token();
  auto result = python(escaping_grandchild_script(token) + "time.sleep(60)\n",
                       with_rw_bind(shared.path(), "/out"), 3000ms);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_FALSE(shared.read("started").empty()) << "the grandchild never ran";
  expect_nothing_survives(token);
}

}  // namespace
}  // namespace rlm::sectest
