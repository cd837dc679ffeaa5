// rlm-pool-bench: what a run from a warm pool costs, beside what running the same program costs
// with no sandbox at all, measured in the same process:
//   fork_exec     fork + exec + wait of /bin/true on the host (no sandbox): the baseline
//   pool_run      Pool::run of /bin/true on the shipped default policy, a warm sandbox ready:
//                 the payload message, its exec, supervision and the Result (the pool is waited
//                 for, untimed, to be full again before each sample)
//   cold_run      the namespace backend's run() of /bin/true in this process: the library's cold
//                 path (no pool, no server), taken while the pool is idle so no refill races it
//   bwrap         today's bubblewrap line (bwrap_line.hpp) run from here, beside cold_run: the
//                 baseline of the cold path's target, <= 1.0x
// Samples are interleaved round by round. Then, honestly, the sustained figure: back-to-back
// Pool::run calls with no wait between them (the refill thread races the caller; runs that find
// the pool empty go cold), as runs per second and the share that was warm.
//
//   rlm-pool-bench [--samples=N] [--sustained=N] [--sandboxes=N] [--bwrap=PATH]
//                  [Google Benchmark flags...]
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bwrap_line.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;

long g_samples = 300;
std::string g_bwrap = "/usr/bin/bwrap";
long g_sustained = 300;
std::size_t g_sandboxes = 4;
std::map<std::string, std::vector<double>> g_samples_ms;
struct Sustained {
  double seconds = 0;
  long runs = 0, warm = 0, failed = 0;
} g_sustained_result;

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// fork + execve + waitpid of `command` (/bin/true by default); negative when it failed.
double fork_exec_ms(const std::vector<std::string>& command = {"/bin/true"}) {
  std::vector<char*> argv;
  for (const auto& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    char* const envp[] = {nullptr};
    execve(argv[0], argv.data(), envp);
    _exit(127);
  }
  if (pid < 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  const double ms = ms_since(start);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -1;
}

void wait_full(const rlm::Pool& pool) {
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (pool.stats().ready_sandboxes < g_sandboxes && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void BM_InterleavedPoolRun(benchmark::State& state) {
  const rlm::Policy policy = rlm::load_policy("default");
  rlm::Pool pool(policy, {.sandboxes = g_sandboxes});
  auto backend = rlm::make_backend("namespace");
  rlm::Request request;
  request.argv = {"/bin/true"};
  const auto bwrap_command = rlm::bench::bwrap_true(g_bwrap);
  for (auto _ : state) {
    for (long round = 0; round < g_samples; ++round) {
      const double baseline = fork_exec_ms();
      if (baseline >= 0) g_samples_ms["fork_exec"].push_back(baseline);

      wait_full(pool);  // untimed: the pool as a caller finds it after a pause
      const auto warm_before = pool.stats().warm_runs;
      auto start = Clock::now();
      const auto pooled = pool.run(request);
      const double pooled_ms = ms_since(start);
      if (pooled.status == rlm::Status::ok && pool.stats().warm_runs == warm_before + 1)
        g_samples_ms["pool_run"].push_back(pooled_ms);

      if (round % 2 == 0) {  // the cold path is slow: fewer samples, same rounds
        wait_full(pool);     // untimed: no refill beside the cold run
        start = Clock::now();
        const auto cold = backend->run(request, policy);
        if (cold.status == rlm::Status::ok) g_samples_ms["cold_run"].push_back(ms_since(start));
        if (const double bwrap = fork_exec_ms(bwrap_command); bwrap >= 0)
          g_samples_ms["bwrap"].push_back(bwrap);
      }
    }
    // Sustained: back to back, no waiting for the refill.
    wait_full(pool);
    const auto before = pool.stats();
    const auto start = Clock::now();
    for (long i = 0; i < g_sustained; ++i) {
      const auto result = pool.run(request);
      if (result.status != rlm::Status::ok) ++g_sustained_result.failed;
    }
    g_sustained_result.seconds = ms_since(start) / 1000;
    const auto after = pool.stats();
    g_sustained_result.runs = g_sustained;
    g_sustained_result.warm = static_cast<long>(after.warm_runs - before.warm_runs);
  }
  for (const char* name : {"fork_exec", "pool_run", "cold_run", "bwrap"})
    state.counters[std::string(name) + "_median_ms"] = percentile(g_samples_ms[name], 0.5);
}
BENCHMARK(BM_InterleavedPoolRun)->Iterations(1)->Unit(benchmark::kMillisecond);

void print_table() {
  std::printf("\n%-10s %10s %10s %10s %8s   %s\n", "step", "median ms", "p99.9 ms", "p99.9/med",
              "samples", "ratio to fork_exec median");
  const double base = percentile(g_samples_ms["fork_exec"], 0.5);
  for (const char* name : {"fork_exec", "pool_run", "cold_run", "bwrap"}) {
    const auto& samples = g_samples_ms[name];
    if (samples.empty()) {
      std::printf("%-10s no successful samples\n", name);
      continue;
    }
    const double median = percentile(samples, 0.5), tail = percentile(samples, 0.999);
    std::printf("%-10s %10.3f %10.3f %9.2fx %8zu   %.2fx\n", name, median, tail, tail / median,
                samples.size(), base > 0 ? median / base : 0.0);
  }
  const auto& s = g_sustained_result;
  if (s.runs > 0 && s.seconds > 0)
    std::printf(
        "\nsustained: %ld back-to-back Pool::run in %.2f s = %.0f runs/s (%ld warm, %ld cold, "
        "%ld failed; pool of %zu)\n",
        s.runs, s.seconds, static_cast<double>(s.runs) / s.seconds, s.warm, s.runs - s.warm,
        s.failed, g_sandboxes);
  const double cold = percentile(g_samples_ms["cold_run"], 0.5),
               bwrap = percentile(g_samples_ms["bwrap"], 0.5);
  if (cold > 0 && bwrap > 0)
    std::printf("\nthe library's cold path / bwrap median: %.2f  (target <= 1.0: %s)\n",
                cold / bwrap, cold / bwrap <= 1.0 ? "met" : "NOT met");
  std::printf("targets: pool_run median <= 2x fork_exec; p99.9 <= 5x its median\n");
}

}  // namespace

// "--name=N" into `value` (at least `least`); false when `arg` is not that flag.
static bool number_flag(const char* arg, std::string_view name, long least, long& value) {
  const std::string_view text(arg);
  if (text.size() <= name.size() + 3 || text.substr(0, 2) != "--" ||
      text.substr(2, name.size()) != name || text[name.size() + 2] != '=')
    return false;
  value = std::max(least, std::atol(arg + name.size() + 3));
  return true;
}

int main(int argc, char** argv) {
  long sandboxes = static_cast<long>(g_sandboxes);
  std::vector<char*> benchmark_args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.starts_with("--bwrap=")) {
      g_bwrap = std::string(arg.substr(8));
      continue;
    }
    const bool ours = number_flag(argv[i], "samples", 1, g_samples) ||
                      number_flag(argv[i], "sustained", 0, g_sustained) ||
                      number_flag(argv[i], "sandboxes", 1, sandboxes);
    if (!ours) benchmark_args.push_back(argv[i]);
  }
  g_sandboxes = static_cast<std::size_t>(sandboxes);
  int count = static_cast<int>(benchmark_args.size());
  benchmark::Initialize(&count, benchmark_args.data());
  // A mistyped flag of ours would otherwise be taken for Google Benchmark's and ignored.
  if (benchmark::ReportUnrecognizedArguments(count, benchmark_args.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
