// rlm-session-bench: what a step of an RLM loop costs in a sandboxed session, beside what it costs
// without one, measured in the same process:
//   cold_python     posix_spawn + wait of `/usr/bin/python3 -c pass` on the host (no sandbox): what
//                   a fresh interpreter per cell would cost
//   cell_pass       Session::execute("pass") on the namespace backend: a whole cell round trip,
//                   checkpoint fork and output capture included
//   llm_query_echo  one llm_query('x') answered by the echo handler, timed inside the sandbox
//   docker_exec     `docker exec CONTAINER python3 -c pass` when a daemon and the test image are
//                   there (tools/docker-env), else skipped with the reason
// Samples are interleaved round by round; each benchmark reports median and p99 as counters, and a
// table with the ratios is printed at the end.
//
//   rlm-session-bench [--samples=N] [Google Benchmark flags...]
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

long g_samples = 300;
std::map<std::string, std::vector<double>> g_samples_ms;
std::map<std::string, std::string> g_skipped;

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
}

// Runs argv to completion; returns its wall time in ms, or a negative number when it failed.
double spawn_ms(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const auto start = Clock::now();
  pid_t pid;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -1;
}

std::string docker_container() {
  // A throw-away container from the project's test image, if a daemon is there.
  FILE* pipe = popen(
      "docker run -d --rm --label rlm-sandbox-bench=1 -v /usr:/usr:ro -v /lib:/lib:ro "
      "-v /lib64:/lib64:ro rlm-sandbox-test:busybox sleep 600 2>/dev/null",
      "r");
  if (!pipe) return "";
  char id[128] = {0};
  const bool read = fgets(id, sizeof id, pipe) != nullptr;
  pclose(pipe);
  std::string container = read ? std::string(id) : "";
  while (!container.empty() && container.back() == '\n') container.pop_back();
  return container;
}

void BM_InterleavedRlmSteps(benchmark::State& state) {
  rlm::Policy policy = rlm::load_policy("python-repl");
  auto backend = rlm::make_backend("namespace");
  rlm::SessionOptions options;
  options.llm = rlm::make_llm_handler("echo");
  auto session = backend->open_session(policy, options);
  const std::string container = docker_container();
  if (container.empty())
    g_skipped["docker_exec"] = "no Docker daemon or no rlm-sandbox-test:busybox image";
  // The llm_query round trip is timed inside the sandbox, 20 calls per cell, median taken.
  const std::string llm_cell =
      "import time\n"
      "_t = []\n"
      "for _ in range(20):\n"
      "    _s = time.perf_counter(); llm_query('x'); _t.append(time.perf_counter() - _s)\n"
      "print(' '.join('%.6f' % (t * 1000) for t in _t))";

  for (auto _ : state) {
    for (long round = 0; round < g_samples; ++round) {
      const double cold = spawn_ms({"/usr/bin/python3", "-c", "pass"});
      if (cold >= 0) g_samples_ms["cold_python"].push_back(cold);

      const auto start = Clock::now();
      const auto cell = session->execute("pass");
      if (cell.status == rlm::CellStatus::ok)
        g_samples_ms["cell_pass"].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - start).count());

      if (round % 10 == 0) {
        const auto timed = session->execute(llm_cell);
        std::istringstream values(timed.stdout_data);
        for (double ms; values >> ms;) g_samples_ms["llm_query_echo"].push_back(ms);
      }
      if (!container.empty()) {
        const double exec = spawn_ms({"docker", "exec", container, "python3", "-c", "pass"});
        if (exec >= 0) g_samples_ms["docker_exec"].push_back(exec);
      }
    }
  }
  session->close();
  if (!container.empty()) spawn_ms({"docker", "rm", "-f", container});
  for (const char* name : {"cold_python", "cell_pass", "llm_query_echo", "docker_exec"}) {
    const auto& samples = g_samples_ms[name];
    state.counters[std::string(name) + "_median_ms"] = percentile(samples, 0.5);
  }
}
BENCHMARK(BM_InterleavedRlmSteps)->Iterations(1)->Unit(benchmark::kMillisecond);

void print_table() {
  std::printf("\n%-16s %10s %10s %8s   %s\n", "step", "median ms", "p99 ms", "samples",
              "ratio to cold python3 -c pass");
  const double cold = percentile(g_samples_ms["cold_python"], 0.5);
  for (const char* name : {"cold_python", "cell_pass", "llm_query_echo", "docker_exec"}) {
    const auto& samples = g_samples_ms[name];
    if (samples.empty()) {
      std::printf("%-16s skipped: %s\n", name, g_skipped[name].c_str());
      continue;
    }
    const double median = percentile(samples, 0.5);
    std::printf("%-16s %10.3f %10.3f %8zu   %.2fx\n", name, median, percentile(samples, 0.99),
                samples.size(), cold > 0 ? median / cold : 0.0);
  }
  std::printf("\ntargets: cell_pass median < 1 ms, llm_query_echo median < 0.5 ms\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--samples=", 10) == 0)
      g_samples = std::max(1L, std::atol(argv[i] + 10));
    else
      rest.push_back(argv[i]);
  }
  int count = static_cast<int>(rest.size());
  benchmark::Initialize(&count, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
