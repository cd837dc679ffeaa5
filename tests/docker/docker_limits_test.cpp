// The docker backend's limits: the wall timeout stops the whole container promptly, even when the
// payload ignores SIGTERM; the memory limit ends in memory_limit; output caps, CPU time and
// signals map onto the same statuses as the other backends.
#include <signal.h>

#include <atomic>
#include <thread>

#include "docker_test_util.hpp"
#include "exit_status.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

TEST(DockerLimits, ATimeoutKillsAPayloadThatIgnoresSigtermAndRemovesItsContainer) {
  REQUIRE_DOCKER();
  Request request;
  request.timeout = 1s;
  const auto start = Clock::now();
  const auto result = run_docker_sh("trap '' TERM; sleep 60 & sleep 60", busybox_policy(), request);
  const auto took = Clock::now() - start;
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_TRUE(result.detail.starts_with("wall time limit 1s exceeded")) << result.detail;
  EXPECT_EQ(cli::exit_status(result), 124);
  EXPECT_GE(took, 1s);
  EXPECT_LT(took, 2s) << "timeout + 1 s, container removal included";
  std::printf(
      "[ measure ] timeout 1s, SIGTERM ignored: run() returned after %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_TRUE(containers_of_this_process().empty()) << "the container is gone";
}

TEST(DockerLimits, AMemoryBalloonHitsTheMemoryLimit) {
  REQUIRE_DOCKER();
  Policy policy = docker_policy();
  policy.limits.memory_bytes = 64ull << 20;
  const auto result = run_docker({"python3", "-c", "b = bytearray(1 << 30)"}, policy);
  EXPECT_EQ(result.status, Status::memory_limit) << describe(result);
  EXPECT_NE(result.detail.find("64M"), std::string::npos) << result.detail;
  EXPECT_EQ(result.signal, SIGKILL);
  EXPECT_EQ(cli::exit_status(result), 137);
  std::printf("[ measure ] 64M balloon (python3): %s, peak %llu bytes, wall %lld ms\n",
              std::string(to_string(result.status)).c_str(),
              static_cast<unsigned long long>(result.peak_memory_bytes),
              static_cast<long long>(result.wall.count() / 1000));
  if (result.peak_memory_bytes > 0) {
    EXPECT_LE(result.peak_memory_bytes, 64ull << 20);
  }
}

TEST(DockerLimits, ABalloonWithoutPythonToo) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.limits.memory_bytes = 64ull << 20;
  // tail keeps the last "line" -- a gigabyte of zero bytes -- in memory.
  const auto result = run_docker_sh("head -c 1073741824 /dev/zero | tail", policy);
  EXPECT_EQ(result.status, Status::memory_limit) << describe(result);
}

TEST(DockerLimits, OutputBeyondTheCapStopsTheRun) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.limits.output_bytes = 64 * 1024;
  const auto start = Clock::now();
  const auto result = run_docker({"yes"}, policy);
  EXPECT_EQ(result.status, Status::output_limit) << result.detail;
  EXPECT_TRUE(result.stdout_truncated);
  EXPECT_EQ(result.stdout_data.size(), 64u * 1024);
  EXPECT_EQ(result.detail, "stdout exceeded the output limit of 64K");
  EXPECT_LT(Clock::now() - start, 10s);
}

TEST(DockerLimits, OutputStreamsToTheCallbacksAsItComes) {
  REQUIRE_DOCKER();
  std::string seen_out, seen_err;
  Request request;
  request.on_stdout = [&](std::string_view data) { seen_out.append(data); };
  request.on_stderr = [&](std::string_view data) { seen_err.append(data); };
  const auto result =
      run_docker_sh("echo one; echo two >&2; echo three", busybox_policy(), request);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(seen_out, "one\nthree\n");
  EXPECT_EQ(seen_err, "two\n");
  EXPECT_EQ(result.stdout_data, "") << "delivered, not kept";
}

TEST(DockerLimits, SignalsAndCpuTimeMapLikeTheOtherBackends) {
  REQUIRE_DOCKER();
  const auto killed = run_docker_sh("kill -KILL $$");
  EXPECT_EQ(killed.status, Status::signaled) << describe(killed);
  EXPECT_EQ(killed.signal, SIGKILL);
  EXPECT_EQ(killed.exit_code, -1);
  EXPECT_EQ(cli::exit_status(killed), 137);

  Policy policy = busybox_policy();
  policy.limits.cpu_time = 1s;
  const auto spinning = run_docker_sh("while :; do :; done", policy);
  EXPECT_EQ(spinning.status, Status::cpu_limit) << describe(spinning);
  // Sampled from the container's stats while it ran: up to one interval short of the budget.
  EXPECT_GT(spinning.cpu, 0us) << describe(spinning);

  const auto missing = run_docker({"no-such-command"}, busybox_policy());
  EXPECT_EQ(missing.status, Status::exit_nonzero) << describe(missing);
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_EQ(cli::exit_status(missing), 127);
}

// Issue 11 line 15: RLIMIT_CPU (Ulimits) counts each process alone; the container's cgroup counts
// a chain of short-lived burners together, and the run ends cpu_limit near the budget.
TEST(DockerLimits, CpuTimeBoundsTheWholeContainerNotEachProcess) {
  REQUIRE_DOCKER();
  Policy policy = docker_policy();  // the host's coreutils timeout
  policy.limits.cpu_time = 1s;
  const auto result =
      run_docker({"sh", "-c",
                  "for i in 1 2 3 4 5 6; do python3 -c 'import time\nt = "
                  "time.process_time()\nwhile time.process_time() - t < 0.6: pass'; done"},
                 policy);
  EXPECT_EQ(result.status, Status::cpu_limit) << describe(result);
  EXPECT_EQ(cli::exit_status(result), 128 + SIGXCPU) << describe(result);
  EXPECT_NE(result.detail.find("limits.cpu_time_ms"), std::string::npos) << describe(result);
  // Sampled every 10 ms while it ran: not the 3.6 s of the whole chain.
  EXPECT_GE(result.cpu, 900ms) << describe(result);
  EXPECT_LE(result.cpu, 1500ms) << describe(result);
  EXPECT_TRUE(containers_of_this_process().empty()) << "the container is gone";
}

// limits.cpus -> NanoCpus: two burners for 1.5 s of wall time get half a CPU between them.
TEST(DockerLimits, CpusBoundsTheContainersBandwidth) {
  REQUIRE_DOCKER();
  Policy policy = docker_policy();
  policy.limits.cpus = 0.5;
  // The daemon holds the container to what it was created with: read it while it runs.
  std::atomic<bool> done{false};
  std::atomic<std::int64_t> nano_cpus{-1};
  std::thread watcher([&] {
    const auto api = test_api();
    while (!done && nano_cpus < 0) {
      for (const auto& id : containers_of_this_process()) {
        try {
          const auto config = api.expect_json("GET", "/containers/" + id + "/json")["HostConfig"];
          nano_cpus = config.value("NanoCpus", std::int64_t{0});
        } catch (const std::exception&) {  // gone meanwhile
        }
      }
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto result = run_docker(
      {"sh", "-c", "b() { timeout 1.5 sh -c 'while :; do :; done'; }; b & b & wait"}, policy);
  done = true;
  watcher.join();
  EXPECT_EQ(nano_cpus, 500'000'000);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_GE(result.wall, 1500ms) << describe(result);
  ASSERT_GT(result.cpu, 0us) << "no CPU reading from the container's cgroup: " << describe(result);
  const auto per_wall = static_cast<double>(result.cpu.count()) / result.wall.count();
  EXPECT_LE(per_wall, 0.6) << describe(result);
}

TEST(DockerLimits, ThePidsLimitHoldsInsideTheContainer) {
  REQUIRE_DOCKER();
  Policy policy = busybox_policy();
  policy.limits.pids = 8;
  // Twenty background sleeps cannot all start under a limit of 8 processes.
  const auto result = run_docker_sh(
      "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 5 & done; echo looped",
      policy);
  EXPECT_NE(result.status, Status::timeout) << describe(result);
  EXPECT_NE(result.stderr_data.find("can't fork"), std::string::npos)
      << "forks past the limit fail: " << describe(result);
}

}  // namespace
}  // namespace rlm::test
