// What the local backend enforces: wall time (with the kill grace), output caps, CPU time, file
// size, open files and address space -- and that stopping a payload stops all of it.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <stdexcept>
#include <thread>

#include "exit_status.hpp"
#include "local_test_util.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

long long elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

pid_t read_pid(const TempDir& dir, const std::string& name) {
  const auto text = dir.read(name);
  return text.empty() ? 0 : static_cast<pid_t>(std::stoi(text));
}

TEST(LocalLimits, TimeoutKillsASetsidGrandchild) {
  TempDir dir;
  Policy policy = local_policy();
  policy.limits.wall_time = 1s;
  const auto start = Clock::now();
  auto result = run_sh(
      "setsid sh -c 'echo $$ > " + dir.file("grandchild.pid") + "; exec sleep 60' & sleep 60",
      policy);
  const auto took = elapsed_ms(start);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_EQ(result.detail, "wall time limit 1s exceeded");
  EXPECT_EQ(cli::exit_status(result), 124);
  EXPECT_LT(took, 2000);
  EXPECT_GE(result.wall, 1s);
  const pid_t grandchild = read_pid(dir, "grandchild.pid");
  ASSERT_GT(grandchild, 1);
  EXPECT_FALSE(process_alive(grandchild)) << "setsid grandchild " << grandchild << " survived";
  std::printf("setsid case: run() returned after %lld ms\n", took);
}

// The local policy with a wall-time limit of `wall` and `grace` between SIGTERM and SIGKILL.
Policy timing_out(std::chrono::milliseconds wall, std::chrono::milliseconds grace) {
  Policy policy = local_policy();
  policy.limits.wall_time = wall;
  policy.limits.kill_grace = grace;
  return policy;
}

TEST(LocalLimits, GraceLetsThePayloadCleanUp) {
  const Policy policy = timing_out(300ms, 2s);
  const auto start = Clock::now();
  auto result = run_sh("trap 'echo cleaned; exit 9' TERM; while :; do sleep 0.05; done", policy);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_EQ(result.stdout_data, "cleaned\n");
  EXPECT_EQ(result.exit_code, 9);
  EXPECT_LT(elapsed_ms(start), 1500)
      << "a payload that exits on SIGTERM must not wait out the grace";
}

TEST(LocalLimits, PayloadIgnoringSigtermIsKilledAfterTheGrace) {
  const Policy policy = timing_out(500ms, 300ms);
  const auto start = Clock::now();
  auto result = run_sh("trap '' TERM; while :; do sleep 0.05; done", policy);
  const auto took = elapsed_ms(start);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_EQ(result.signal, 9);
  EXPECT_GE(took, 800);
  EXPECT_LT(took, 1800);
}

TEST(LocalLimits, OutputFloodIsCutAtTheCapPromptlyWithBoundedMemory) {
  Policy policy = local_policy();
  policy.limits.output_bytes = 1u << 20;
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const auto start = Clock::now();
  auto result = run_local({"head", "-c", "1073741824", "/dev/zero"}, policy);
  const auto took = elapsed_ms(start);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_EQ(result.status, Status::output_limit) << result.detail;
  EXPECT_EQ(result.detail, "stdout exceeded the output limit of 1M");
  EXPECT_EQ(result.stdout_data.size(), 1u << 20);
  EXPECT_EQ(result.stdout_data, std::string(1u << 20, '\0'));
  EXPECT_TRUE(result.stdout_truncated);
  EXPECT_FALSE(result.stderr_truncated);
  EXPECT_LT(took, 3000);
  const long grew_kib = after.ru_maxrss - before.ru_maxrss;
  EXPECT_LT(grew_kib, 32 * 1024) << "this process grew by " << grew_kib << " KiB";
  std::printf("1 GiB flood: returned after %lld ms; peak RSS grew by %ld KiB\n", took, grew_kib);
}

TEST(LocalLimits, StderrHasItsOwnCap) {
  Policy policy = local_policy();
  policy.limits.output_bytes = 1000;
  auto result = run_sh("echo small; head -c 100000 /dev/zero >&2", policy);
  EXPECT_EQ(result.status, Status::output_limit) << result.detail;
  EXPECT_EQ(result.stdout_data, "small\n");
  EXPECT_EQ(result.stderr_data.size(), 1000u);
  EXPECT_FALSE(result.stdout_truncated);
  EXPECT_TRUE(result.stderr_truncated);
}

TEST(LocalLimits, OutputOfExactlyTheCapIsNotTruncated) {
  Policy policy = local_policy();
  policy.limits.output_bytes = 4096;
  auto result = run_local({"head", "-c", "4096", "/dev/zero"}, policy);
  EXPECT_EQ(result.status, Status::ok) << result.detail;
  EXPECT_EQ(result.stdout_data.size(), 4096u);
  EXPECT_FALSE(result.stdout_truncated);
}

TEST(LocalLimits, StreamingDeliversOutputAsItArrives) {
  std::string streamed, streamed_err;
  long long first_chunk_ms = -1;
  const auto start = Clock::now();
  Request request;
  request.on_stdout = [&](std::string_view data) {
    if (first_chunk_ms < 0) first_chunk_ms = elapsed_ms(start);
    streamed.append(data);
  };
  request.on_stderr = [&](std::string_view data) { streamed_err.append(data); };
  auto result = run_sh("echo first; echo warn >&2; sleep 1; echo second", local_policy(), request);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(streamed, "first\nsecond\n");
  EXPECT_EQ(streamed_err, "warn\n");
  EXPECT_EQ(result.stdout_data, "") << "streamed output must not be kept too";
  EXPECT_EQ(result.stderr_data, "");
  EXPECT_GE(first_chunk_ms, 0);
  EXPECT_LT(first_chunk_ms, 800) << "the first line arrived only at the end";
}

TEST(LocalLimits, StreamingRespectsTheCap) {
  Policy policy = local_policy();
  policy.limits.output_bytes = 100'000;
  std::size_t delivered = 0;
  Request request;
  request.on_stdout = [&](std::string_view data) { delivered += data.size(); };
  auto result = run_local({"head", "-c", "10000000", "/dev/zero"}, policy, request);
  EXPECT_EQ(result.status, Status::output_limit);
  EXPECT_EQ(delivered, 100'000u);
  EXPECT_TRUE(result.stdout_truncated);
  EXPECT_EQ(result.stdout_data, "");
}

TEST(LocalLimits, ACallbackThatThrowsStopsThePayloadAndPropagates) {
  TempDir dir;
  Request request;
  request.on_stdout = [](std::string_view) { throw std::runtime_error("sink broke"); };
  const auto start = Clock::now();
  EXPECT_THROW(
      {
        try {
          run_sh("echo $$ > " + dir.file("pid") + "; echo data; sleep 30", local_policy(), request);
        } catch (const std::runtime_error& error) {
          EXPECT_STREQ(error.what(), "sink broke");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_LT(elapsed_ms(start), 2000);
  const pid_t payload = read_pid(dir, "pid");
  ASSERT_GT(payload, 1);
  EXPECT_FALSE(process_alive(payload));
}

// A CPU budget of one second, with room on the wall clock: on a loaded machine a second of CPU
// takes many of wall time.
Policy one_cpu_second() {
  Policy policy = local_policy();
  policy.limits.cpu_time = 1s;
  policy.limits.wall_time = 60s;
  return policy;
}

TEST(LocalLimits, CpuTimeLimitEndsABusyLoop) {
  const Policy policy = one_cpu_second();
  auto result = run_sh("while :; do :; done", policy);
  EXPECT_EQ(result.status, Status::cpu_limit) << describe(result);
  EXPECT_EQ(result.signal, SIGXCPU);
  EXPECT_EQ(result.detail, "CPU time limit 1s exceeded");
  // The kernel fires RLIMIT_CPU on tick-sampled time while wait4 reports precise runtime; under
  // load the two differ by tens of percent.
  EXPECT_GE(result.cpu, 500ms);
}

TEST(LocalLimits, CpuTimeLimitHoldsWhenSigxcpuIsIgnored) {
  const Policy policy = one_cpu_second();
  auto result = run_sh("trap '' XCPU; while :; do :; done", policy);
  EXPECT_EQ(result.status, Status::cpu_limit) << describe(result);
  EXPECT_EQ(result.signal, SIGKILL);
  EXPECT_GE(result.cpu, policy.limits.cpu_time)
      << "SIGKILL counts as cpu_limit only past the budget";
}

TEST(LocalLimits, FileSizeLimitStopsAGrowingFile) {
  TempDir dir;
  Policy policy = local_policy();
  policy.filesystem.workdir = dir.path();
  policy.limits.file_size_bytes = 64 * 1024;
  auto result = run_sh("head -c 1000000 /dev/zero > big", policy);
  EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);  // sh reports head's death
  EXPECT_EQ(dir.read("big").size(), 64u * 1024);
  auto direct = run_sh("exec head -c 1000000 /dev/zero > big2", policy);
  EXPECT_EQ(direct.status, Status::signaled) << describe(direct);
  EXPECT_EQ(direct.signal, SIGXFSZ);
  EXPECT_NE(direct.detail.find("limits.file_size_bytes"), std::string::npos);
}

TEST(LocalLimits, OpenFilesAndAddressSpaceAreRlimits) {
  Policy policy = local_policy();
  policy.limits.open_files = 77;
  policy.limits.memory_bytes = 512ull << 20;
  auto result = run_sh("ulimit -n; ulimit -v; ulimit -c", policy);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "77\n524288\n0\n");
}

TEST(LocalLimits, AnAllocationPastTheMemoryLimitFails) {
  Policy policy = local_policy();
  policy.limits.memory_bytes = 64ull << 20;
  // 128 MiB in one string: beyond RLIMIT_AS, so the allocation fails instead of the host swapping.
  auto result = run_local({"python3", "-c", "x = b'a' * (128 << 20)"}, policy);
  EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);
  EXPECT_NE(result.stderr_data.find("MemoryError"), std::string::npos) << result.stderr_data;
}

TEST(LocalLimits, AProcessFloodConvergesAndLeavesNothing) {
  // A payload that keeps forking background processes as fast as it can until it is stopped.
  const std::string marker = "61.4321";
  Policy policy = local_policy();
  policy.limits.wall_time = 1s;
  const auto start = Clock::now();
  auto result = run_sh("while :; do sleep " + marker + " & done", policy);
  const auto took = elapsed_ms(start);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_LT(took, 3000);
  EXPECT_TRUE(processes_with_cmdline("sleep " + marker).empty());
  std::printf("process flood: run() returned after %lld ms\n", took);
}

}  // namespace
}  // namespace rlm::test
