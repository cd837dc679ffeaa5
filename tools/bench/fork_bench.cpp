// rlm-fork-bench: what fork_session, save and load cost (docs/sessions.md, "Fork" and "Save and
// restore"), beside opening a session from nothing, measured in the same process, interleaved
// round by round (public API only):
//   cold_first_cell      Backend::open_session + the first cell (`x = len(context)`): the baseline
//   fork1_cold           fork_session(1) of a small session (1 KB context, a few variables), its
//                        branch opened cold, to the branch's first cell result
//   fork1_pooled         the same, the branch a warm session of an rlm::Pool
//   fork8_100mb_cold     fork_session(8) of a session holding 100 MB, to all eight first results
//   fork8_100mb_pooled   the same, the branches warm sessions
//   save_100mb           Session::save of the 100 MB session to a file
//   load_100mb           a warm session's Session::load of that file
// and the memory the eight branches hold before they write, against the parent's (the anonymous
// resident memory of each interpreter).
//
//   rlm-fork-bench [--rounds=N] [Google Benchmark flags...]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/pool.hpp"
#include "rlm_sandbox/session.hpp"

namespace {

using Clock = std::chrono::steady_clock;

long g_rounds = 5;
constexpr std::size_t kBranches = 8;
std::map<std::string, std::vector<double>> g_samples_ms;
std::vector<double> g_memory_ratio;

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
}

double since_ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void require_ok(const rlm::CellResult& cell, const char* what) {
  if (cell.status == rlm::CellStatus::ok) return;
  std::fprintf(stderr, "%s failed: %s\n", what, cell.to_json().dump().c_str());
  std::exit(1);
}

// The interpreter's anonymous resident memory, in bytes.
constexpr const char* kRssAnon =
    "print([int(l.split()[1]) * 1024 for l in open('/proc/self/status') "
    "if l.startswith('RssAnon')][0])";

double rss_anon(rlm::Session& session) {
  const auto cell = session.execute(kRssAnon);
  require_ok(cell, "RssAnon");
  return std::stod(cell.stdout_data);
}

// Forks `parent` into `count` branches opened by `open`, runs each branch's first cell (all at
// once, as a best-of-N caller would); the time to the last result.
template <typename Open>
double fork_to_results_ms(rlm::Session& parent, std::size_t count, Open open,
                          std::vector<std::unique_ptr<rlm::Session>>* keep = nullptr) {
  const auto start = Clock::now();
  auto forked = rlm::fork_session(parent, count, [&](std::size_t) { return open(); });
  std::vector<std::thread> cells;
  for (auto& branch : forked.branches)
    cells.emplace_back([&branch] { require_ok(branch->execute("x = 1"), "a branch's cell"); });
  for (auto& thread : cells) thread.join();
  const double ms = since_ms(start);
  if (keep)
    *keep = std::move(forked.branches);
  else
    for (auto& branch : forked.branches) branch->close();
  return ms;
}

void BM_Fork(benchmark::State& state) {
  const rlm::Policy policy = rlm::load_policy("python-repl");
  auto backend = rlm::make_backend("namespace");
  rlm::PoolOptions pool_options;
  pool_options.sandboxes = 0;
  pool_options.sessions = kBranches;
  rlm::Pool pool(policy, pool_options);
  const auto refilled = [&] {
    while (pool.stats().ready_sessions < pool_options.sessions)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  const auto cold = [&] { return backend->open_session(policy, {}); };
  const auto pooled = [&] { return pool.open_session({}); };

  rlm::SessionOptions small_options;
  small_options.context = std::string(1000, 'c');
  auto small = backend->open_session(policy, small_options);
  require_ok(small->execute("import json\nnumbers = list(range(100))\ndef f(v):\n  return v"),
             "the small session");
  auto large = backend->open_session(policy, {});
  require_ok(large->execute("big = b'x' * (100 << 20)"), "the 100 MB session");
  char dir[] = "/tmp/rlm-fork-bench-XXXXXX";
  if (!mkdtemp(dir)) std::exit(1);
  const std::string path = std::string(dir) + "/state.save";

  for (auto _ : state) {
    for (long round = 0; round < g_rounds; ++round) {
      {
        const auto start = Clock::now();
        auto session = backend->open_session(policy, small_options);
        require_ok(session->execute("x = len(context)"), "the cold first cell");
        g_samples_ms["cold_first_cell"].push_back(since_ms(start));
        session->close();
      }
      g_samples_ms["fork1_cold"].push_back(fork_to_results_ms(*small, 1, cold));
      refilled();
      g_samples_ms["fork1_pooled"].push_back(fork_to_results_ms(*small, 1, pooled));
      g_samples_ms["fork8_100mb_cold"].push_back(fork_to_results_ms(*large, kBranches, cold));
      refilled();
      std::vector<std::unique_ptr<rlm::Session>> branches;
      g_samples_ms["fork8_100mb_pooled"].push_back(
          fork_to_results_ms(*large, kBranches, pooled, &branches));
      double held = 0;
      for (auto& branch : branches) held += rss_anon(*branch);
      g_memory_ratio.push_back(held / rss_anon(*large));
      for (auto& branch : branches) branch->close();
      {
        const auto start = Clock::now();
        require_ok(large->save(path), "the save");
        g_samples_ms["save_100mb"].push_back(since_ms(start));
      }
      refilled();
      {
        auto session = pool.open_session({});
        const auto start = Clock::now();
        require_ok(session->load(path), "the load");
        g_samples_ms["load_100mb"].push_back(since_ms(start));
        session->close();
      }
    }
  }
  std::remove(path.c_str());
  rmdir(dir);
  for (const auto& [name, samples] : g_samples_ms)
    state.counters[name + "_median_ms"] = percentile(samples, 0.5);
}
BENCHMARK(BM_Fork)->Iterations(1)->Unit(benchmark::kMillisecond);

void print_table() {
  const double cold = percentile(g_samples_ms["cold_first_cell"], 0.5);
  std::printf("\n%-22s %10s %10s %8s   %s\n", "step", "median ms", "max ms", "samples",
              "ratio to cold_first_cell");
  for (const char* name : {"cold_first_cell", "fork1_cold", "fork1_pooled", "fork8_100mb_cold",
                           "fork8_100mb_pooled", "save_100mb", "load_100mb"}) {
    const auto& samples = g_samples_ms[name];
    const double median = percentile(samples, 0.5);
    std::printf("%-22s %10.1f %10.1f %8zu   %.2fx\n", name, median, percentile(samples, 1.0),
                samples.size(), cold > 0 ? median / cold : 0.0);
  }
  std::printf("eight branches hold %.2fx the parent's anonymous memory before they write\n",
              percentile(g_memory_ratio, 0.5));
  std::printf(
      "targets (issue 29): fork1 median <= 10 ms; fork8_100mb <= 60 ms with branches under "
      "1.5x the parent's memory\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> passed;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0)
      g_rounds = std::max(1L, std::atol(argv[i] + 9));
    else
      passed.push_back(argv[i]);
  }
  int count = static_cast<int>(passed.size());
  benchmark::Initialize(&count, passed.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
