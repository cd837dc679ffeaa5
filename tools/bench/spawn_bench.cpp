// rlm-bench: what one sandboxed run costs, end to end, against bubblewrap.
//
// Each sample is a whole command as a user runs it -- posix_spawn + exec + waitpid of
// `rlm-sandbox run --policy default -- /bin/true`, of the equivalent bwrap command line, and of
// `rlm-sandbox run --policy trusted-local -- /bin/true` (the unisolated local backend, for
// reference), and of `runc run` of an OCI bundle with the default policy's isolation (namespaces,
// memory and pids cgroup, the policy's seccomp rules, no capabilities: runc_bundle.hpp). The
// commands are interleaved round by round in one process, so every column sees the same machine
// state; the order rotates each round so none always runs first. The samples are collected inside
// one Google Benchmark benchmark (its time column is one round: all commands); the percentiles are
// reported as its counters and in a table printed after it. Beside the wall time, each sample's CPU
// time (user + system of the command and everything it waited for, from wait4's rusage) is
// recorded: on a shared, loaded machine it moves far less than the wall time, so it shows where a
// change's gain comes from.
//
// The targets printed are issue 12's for the cold path (no server, no pool): the median at most
// 1.0x bubblewrap's, and the p99.9 at most 5x the median. Measure an optimised build (tools/build
// configures RelWithDebInfo, -O2; tools/bench/run says which build it measures).
//
//   rlm-bench [--samples=N] [--warmup=N] [--rlm-sandbox=PATH] [--compare=PATH] [--bwrap=PATH]
//             [--no-bwrap] [--no-local] [--runc=PATH] [--no-runc] [--csv=FILE]
//             [Google Benchmark flags...]
//
// --compare=PATH adds another build's rlm-sandbox as a column of its own (a change's "no slowdown"
// is shown by its ratio to the build before it, measured in the same rounds).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bwrap_line.hpp"
#include "runc_bundle.hpp"
#include "spawn.hpp"

extern char** environ;

namespace {

using rlm::bench::Sample;
using rlm::bench::spawn_once;

struct Options {
  long samples = 1000;
  long warmup = 20;
  std::string rlm_sandbox;  // default: next to this executable
  std::string compare;      // another build's rlm-sandbox, measured beside it ("" for none)
  std::string bwrap = "/usr/bin/bwrap";
  bool with_bwrap = true;
  bool with_local = true;
  std::string runc;  // default: runc on PATH
  bool with_runc = true;
  std::string csv;
};

struct Column {
  std::string label;  // row name in the table
  std::string key;    // counter prefix
  std::vector<std::string> argv;
  std::string unavailable;         // why it is not measured; "" when it is
  std::vector<double> samples_ms;  // in the order taken
  std::vector<double> cpu_ms;      // the same samples' CPU time (user + system)
  long failures = 0;               // samples whose command did not exit 0
};

struct Stats {
  double median = 0, p99 = 0, p999 = 0, mean = 0, min = 0, max = 0;
};

// Nearest-rank percentile of sorted samples: the smallest sample with at least a fraction q of
// them at or below it. Of 1000 samples, p99 is the 990th smallest and p99.9 the 999th (the second
// largest).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()) - 1e-9));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

Stats stats_of(std::vector<double> samples) {
  Stats s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.median = percentile(samples, 0.5);
  s.p99 = percentile(samples, 0.99);
  s.p999 = percentile(samples, 0.999);
  s.mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

std::string executable_dir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

std::string first_line(const std::string& text) {
  auto line = text.substr(0, text.find('\n'));
  return line.size() > 160 ? line.substr(0, 157) + "..." : line;
}

Options g_options;
std::vector<Column> g_columns;

std::vector<Column*> measured_columns() {
  std::vector<Column*> columns;
  for (auto& column : g_columns)
    if (column.unavailable.empty()) columns.push_back(&column);
  return columns;
}

void BM_InterleavedSpawn(benchmark::State& state) {
  auto columns = measured_columns();
  for (auto* column : columns) {
    column->samples_ms.clear();
    column->cpu_ms.clear();
    column->failures = 0;
  }
  // Warm-up rounds are not recorded: page cache, dentries, the first cgroup of each kind.
  for (long i = 0; i < g_options.warmup; ++i)
    for (auto* column : columns) spawn_once(column->argv);

  size_t round = 0;
  for (auto _ : state) {
    for (size_t k = 0; k < columns.size(); ++k) {
      Column* column = columns[(round + k) % columns.size()];
      if (auto sample = spawn_once(column->argv)) {
        column->samples_ms.push_back(sample->wall_ms);
        column->cpu_ms.push_back(sample->cpu_ms);
      } else
        ++column->failures;
    }
    ++round;
  }

  Stats rlm, bwrap;
  for (auto* column : columns) {
    Stats s = stats_of(column->samples_ms);
    state.counters[column->key + "_p50_ms"] = s.median;
    state.counters[column->key + "_p99_ms"] = s.p99;
    state.counters[column->key + "_p999_ms"] = s.p999;
    if (column->key == "rlm") rlm = s;
    if (column->key == "bwrap") bwrap = s;
  }
  if (rlm.median > 0 && bwrap.median > 0)
    state.counters["rlm/bwrap_p50"] = rlm.median / bwrap.median;
  if (rlm.median > 0) state.counters["rlm_p999/p50"] = rlm.p999 / rlm.median;
  state.SetLabel("time = one round of " + std::to_string(columns.size()) + " commands");
}

std::string join(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) text += (text.empty() ? "" : " ") + arg;
  return text;
}

void print_summary() {
  std::printf("\n");
  utsname host{};
  ::uname(&host);
  double load[3] = {0, 0, 0};
  ::getloadavg(load, 3);
  std::printf("rlm-bench: wall time of fork+exec+wait of each whole command, interleaved\n");
  std::printf("host: %u CPUs, %s %s, load average %.2f %.2f %.2f\n",
              std::thread::hardware_concurrency(), host.sysname, host.release, load[0], load[1],
              load[2]);
  for (const auto& column : g_columns)
    std::printf("  %-28s %s\n", (column.label + ":").c_str(), join(column.argv).c_str());
  std::printf("\n  %-28s %8s %8s %8s %8s %8s %8s %8s %8s %6s\n", "milliseconds", "median", "p99",
              "p99.9", "mean", "min", "max", "cpu p50", "samples", "fail");
  Stats rlm, bwrap, compare, runc, rlm_cpu, bwrap_cpu, compare_cpu, runc_cpu;
  for (const auto& column : g_columns) {
    if (!column.unavailable.empty()) {
      std::printf("  %-28s unavailable: %s\n", column.label.c_str(), column.unavailable.c_str());
      continue;
    }
    Stats s = stats_of(column.samples_ms);
    Stats cpu = stats_of(column.cpu_ms);
    if (column.key == "rlm") rlm = s, rlm_cpu = cpu;
    if (column.key == "bwrap") bwrap = s, bwrap_cpu = cpu;
    if (column.key == "compare") compare = s, compare_cpu = cpu;
    if (column.key == "runc") runc = s, runc_cpu = cpu;
    std::printf("  %-28s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8zu %6ld\n",
                column.label.c_str(), s.median, s.p99, s.p999, s.mean, s.min, s.max, cpu.median,
                column.samples_ms.size(), column.failures);
  }
  std::printf("\n");
  if (rlm.median > 0 && bwrap.median > 0) {
    double ratio = rlm.median / bwrap.median;
    std::printf("  cold path: rlm-sandbox median / bwrap median:  %.2f  (target <= 1.0: %s)\n",
                ratio, ratio <= 1.0 ? "met" : "NOT met");
    if (bwrap_cpu.median > 0)
      std::printf("  CPU time:  rlm-sandbox median / bwrap median:  %.2f  (%.2f / %.2f ms)\n",
                  rlm_cpu.median / bwrap_cpu.median, rlm_cpu.median, bwrap_cpu.median);
  }
  if (rlm.median > 0 && runc.median > 0) {
    std::printf("  cold path: rlm-sandbox median / runc median:   %.2f\n",
                rlm.median / runc.median);
    if (runc_cpu.median > 0)
      std::printf("  CPU time:  rlm-sandbox median / runc median:   %.2f  (%.2f / %.2f ms)\n",
                  rlm_cpu.median / runc_cpu.median, rlm_cpu.median, runc_cpu.median);
  }
  if (rlm.median > 0 && compare.median > 0) {
    std::printf("  rlm-sandbox median / --compare median:         %.2f  (p99.9: %.2f / %.2f ms)\n",
                rlm.median / compare.median, rlm.p999, compare.p999);
    if (compare_cpu.median > 0)
      std::printf("  CPU time:  rlm-sandbox / --compare medians:    %.2f  (%.2f / %.2f ms)\n",
                  rlm_cpu.median / compare_cpu.median, rlm_cpu.median, compare_cpu.median);
  }
  if (rlm.median > 0) {
    double tail = rlm.p999 / rlm.median;
    std::printf("  rlm-sandbox p99.9 / its median:                %.2f  (target <= 5: %s)\n", tail,
                tail <= 5 ? "met" : "NOT met");
  }
  std::printf(
      "  percentiles are nearest-rank (of 1000 samples p99.9 is the second largest); a\n"
      "  \"Library was built as DEBUG\" warning above is about Google Benchmark's own build\n"
      "  and does not affect these timings of whole processes\n");
}

void write_csv(const std::string& path) {
  std::ofstream out(path);
  std::vector<const Column*> columns;
  for (const auto& column : g_columns)
    if (column.unavailable.empty()) columns.push_back(&column);
  for (size_t k = 0; k < columns.size(); ++k)
    out << (k ? "," : "") << columns[k]->key << "_ms," << columns[k]->key << "_cpu_ms";
  out << "\n";
  size_t rows = 0;
  for (const auto* column : columns) rows = std::max(rows, column->samples_ms.size());
  for (size_t i = 0; i < rows; ++i) {
    for (size_t k = 0; k < columns.size(); ++k) {
      if (k) out << ",";
      if (i < columns[k]->samples_ms.size())
        out << columns[k]->samples_ms[i] << "," << columns[k]->cpu_ms[i];
      else
        out << ",";
    }
    out << "\n";
  }
  std::printf("  raw samples written to %s\n", path.c_str());
}

std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  dirs += ":/usr/local/sbin:/usr/sbin:/sbin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// The runc bundle's directory, removed by a child `rm -rf` when the benchmark is interrupted, once
// the command in flight has ended
// (fork, execve and waitpid are async-signal-safe; the destructor does it on a normal exit).
char g_bundle_dir[256];

void remove_bundle_and_exit(int signal) {
  // The command in flight first: a runc still running would make its state directory again.
  while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
  }
  if (pid_t pid = ::fork(); pid == 0) {
    ::execl("/bin/rm", "rm", "-rf", g_bundle_dir, static_cast<char*>(nullptr));
    ::_exit(127);
  } else if (pid > 0) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  ::_exit(128 + signal);
}

void remove_on_signal(const std::filesystem::path& dir) {
  std::snprintf(g_bundle_dir, sizeof g_bundle_dir, "%s", dir.c_str());
  struct sigaction action {};
  action.sa_handler = remove_bundle_and_exit;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

// Our flags are taken out of argv; the rest goes to Google Benchmark.
bool parse_own_flag(const std::string& arg) {
  auto value_of = [&](const char* name) -> std::optional<std::string> {
    std::string prefix = std::string(name) + "=";
    if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
    return std::nullopt;
  };
  auto count = [](const std::string& text, const char* name) {
    char* end = nullptr;
    long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end || value < 0) {
      std::fprintf(stderr, "rlm-bench: %s expects a non-negative integer, got '%s'\n", name,
                   text.c_str());
      std::exit(2);
    }
    return value;
  };
  if (auto v = value_of("--samples")) {
    g_options.samples = std::max(1L, count(*v, "--samples"));
  } else if (auto v = value_of("--warmup")) {
    g_options.warmup = count(*v, "--warmup");
  } else if (auto v = value_of("--rlm-sandbox")) {
    g_options.rlm_sandbox = *v;
  } else if (auto v = value_of("--compare")) {
    g_options.compare = *v;
  } else if (auto v = value_of("--bwrap")) {
    g_options.bwrap = *v;
  } else if (auto v = value_of("--csv")) {
    g_options.csv = *v;
  } else if (auto v = value_of("--runc")) {
    g_options.runc = *v;
  } else if (arg == "--no-runc") {
    g_options.with_runc = false;
  } else if (arg == "--no-bwrap") {
    g_options.with_bwrap = false;
  } else if (arg == "--no-local") {
    g_options.with_local = false;
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "rlm-bench [--samples=N] [--warmup=N] [--rlm-sandbox=PATH] [--compare=PATH]\n"
          "          [--bwrap=PATH] [--no-bwrap] [--no-local] [--csv=FILE] [Google Benchmark "
          "flags]\n"
          "  --samples=N   interleaved samples per command (default 1000)\n"
          "  --warmup=N    unrecorded rounds first (default 20)\n"
          "  --compare=PATH  also time another build's rlm-sandbox in the same rounds\n"
          "  --runc=PATH   the runc to compare with (default: runc on PATH); --no-runc: none\n"
          "  --csv=FILE    also write every sample, one column per command\n");
      return 0;
    }
    if (!parse_own_flag(arg)) rest.push_back(argv[i]);
  }
  if (g_options.rlm_sandbox.empty()) g_options.rlm_sandbox = executable_dir() + "/rlm-sandbox";

  auto add_column = [](std::string label, std::string key, std::vector<std::string> argv) {
    Column column;
    column.label = std::move(label);
    column.key = std::move(key);
    column.argv = std::move(argv);
    g_columns.push_back(std::move(column));
  };
  add_column("rlm-sandbox (default policy)", "rlm",
             {g_options.rlm_sandbox, "run", "--policy", "default", "--", "/bin/true"});
  if (!g_options.compare.empty())
    add_column("--compare (default policy)", "compare",
               {g_options.compare, "run", "--policy", "default", "--", "/bin/true"});
  if (g_options.with_bwrap) add_column("bwrap", "bwrap", rlm::bench::bwrap_true(g_options.bwrap));
  // The runc column's bundle is removed at exit, and by the handler below on SIGINT or SIGTERM.
  std::optional<rlm::bench::RuncBundle> runc_bundle;
  if (g_options.with_runc) {
    std::string why;
    const std::string runc = g_options.runc.empty() ? on_path("runc") : g_options.runc;
    if (runc.empty())
      why = "no runc on PATH";
    else if (::geteuid() != 0)
      why = "runc runs containers with cgroup limits only as root here";
    else if ((runc_bundle = rlm::bench::RuncBundle::make(g_options.rlm_sandbox, runc, why)))
      remove_on_signal(runc_bundle->dir());
    add_column("runc run (OCI bundle)", "runc",
               runc_bundle ? runc_bundle->command() : std::vector<std::string>{runc});
    if (!runc_bundle) g_columns.back().unavailable = why;
  }
  if (g_options.with_local)
    add_column("rlm-sandbox (trusted-local)", "local",
               {g_options.rlm_sandbox, "run", "--policy", "trusted-local", "--", "/bin/true"});

  // A command that cannot run here is reported, not measured (e.g. before the namespace backend
  // is built, `--policy default` exits 125 and says why).
  for (auto& column : g_columns) {
    if (!column.unavailable.empty()) continue;
    std::string err;
    if (!spawn_once(column.argv, &err)) column.unavailable = first_line(err);
  }
  if (measured_columns().empty()) {
    print_summary();
    std::fprintf(stderr, "rlm-bench: no command runs here\n");
    return 1;
  }

  std::fflush(stdout);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  benchmark::RegisterBenchmark("interleaved_spawn", BM_InterleavedSpawn)
      ->Iterations(g_options.samples)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  print_summary();
  if (!g_options.csv.empty()) write_csv(g_options.csv);
  return 0;
}
