// rlm-server-bench: what a run through `rlm-sandbox serve` costs, against bubblewrap and the
// cold `rlm-sandbox run`, and how many runs two clients get through per second.
//
// It starts its own two servers (`serve --pool default=N`, and `--pool default=N,recycle=M`: the
// recycled sandboxes of docs/pools-and-server.md, "recycling server" below) on sockets in a temp
// dir, then:
//  1. latency: whole commands, posix_spawn+exec+wait each (as rlm-bench), interleaved round by
//     round (the order rotating) so every column sees the same machine: `rlm-sandbox run
//     --server S --policy default -- /bin/true`, rlm-bench's bubblewrap line, and the cold
//     `rlm-sandbox run --policy default -- /bin/true`. Medians, p99.9/median and the ratios are
//     printed. A run through the server also times the library's client
//     (rlm::ServerConnection::run in this process: what an orchestrator that keeps running pays,
//     with no CLI exec per run). After each sample through the server the bench waits, untimed,
//     until the pool is full again, so a refill never runs beside another column's sample (the
//     pool's promise is a sandbox ready before the request; what refills cost shows in
//     "sustained" below).
//  3. whole cost (after 2): CPU per run, machine-wide, for /bin/true and `python3 -c pass`: the
//     busy time /proc/stat counts on every CPU (user, nice, system, irq, softirq, steal: the
//     client, the server and its sandboxes, bwrap, the kernel's workers) over --cost-runs runs
//     back to back in one thread, the pool's refill after them included, less the background
//     rate measured in an idle window beside each block. Lines are interleaved block by block.
//  2. throughput: two client threads running back to back, against two threads running bwrap:
//     runs per second. "burst" starts with the pool full and ends when the pool's sandboxes are
//     used; "sustained" runs for --seconds, refills included. Clients are the CLI (an exec per
//     run) and the library (a connection per run). The recycling server's library clients run
//     /bin/true and `python3 -c pass` against bwrap running the same, and against the same
//     payloads with no sandbox (a plain fork+exec: the ceiling of any sandbox's runs per second).
// Build optimised (tools/build does, RelWithDebInfo) before believing any figure.
//
//   rlm-server-bench [--samples=N] [--warmup=N] [--pool=N] [--recycle=M] [--seconds=S]
//                    [--cost-runs=N] [--rlm-sandbox=PATH] [--bwrap=PATH]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bwrap_line.hpp"
#include "rlm_sandbox/client.hpp"
#include "spawn.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  // The burst is as many runs as the pool holds: with 8, two clients are done in about 8 ms, too
  // short a window to measure; 32 gives a steady figure (and the refill, which resumes when a
  // quarter is left, overlaps the same share of any burst).
  long samples = 300, warmup = 10, pool = 32;
  long recycle = 1000;  // runs per sandbox of the recycling server
  double seconds = 10;
  long cost_runs = 200;  // per line and payload, in blocks of a quarter
  std::string rlm_sandbox, bwrap = "/usr/bin/bwrap";
};

// Runs argv to its end with stdio on /dev/null, as rlm-bench times its bubblewrap line; its wall
// time in ms, or nullopt unless it exited 0.
std::optional<double> time_command(const std::vector<std::string>& argv) {
  const auto sample = rlm::bench::spawn_once(argv);
  if (!sample) return std::nullopt;
  return sample->wall_ms;
}

// The value below which a fraction q of the samples lie (nearest rank).
double rank_of(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto index = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size(), std::max<std::size_t>(index, 1)) - 1];
}

// One run of `payload` through the server by the library's client; its wall time in ms, or
// nullopt unless it ended ok.
std::optional<double> time_library_run(const std::string& socket,
                                       std::vector<std::string> payload = {"/bin/true"}) {
  rlm::Request request;
  request.argv = std::move(payload);
  const auto begin = Clock::now();
  try {
    const auto result = rlm::ServerConnection(socket).run(request, "default");
    if (result.status != rlm::Status::ok) return std::nullopt;
  } catch (const rlm::Error&) {
    return std::nullopt;
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
}

struct Line {
  std::string name;
  std::vector<std::string> argv;  // empty: the library's client
  std::vector<double> ms;
  long failed = 0;
  std::string socket;  // the server it runs through ("": none)
};

// Two threads running `one_run` back to back until `until` says stop; runs per second.
double two_clients(const std::function<std::optional<double>()>& one_run,
                   const std::function<bool(long runs, Clock::time_point begin)>& until) {
  std::atomic<long> runs{0}, failed{0};
  const auto begin = Clock::now();
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i)
    clients.emplace_back([&] {
      while (!until(runs.load(), begin)) (one_run() ? runs : failed).fetch_add(1);
    });
  for (auto& client : clients) client.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  if (failed) std::printf("  (%ld runs failed)\n", failed.load());
  return static_cast<double>(runs.load()) / seconds;
}

// How many warm sandboxes the server's default pool has ready now.
long ready_sandboxes(const std::string& socket) {
  const auto hello = rlm::ServerConnection(socket).hello();
  return hello.value("pools", nlohmann::json::object())
      .value("default", nlohmann::json::object())
      .value("ready_sandboxes", 0L);
}

bool wait_for_full_pool(const std::string& socket, long size) {
  for (int i = 0; i < 600; ++i) {
    try {
      if (ready_sandboxes(socket) >= size) return true;
    } catch (const rlm::Error&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Busy CPU time of the whole machine so far, in ms: /proc/stat's first line, every CPU.
double machine_busy_ms() {
  std::FILE* stat = std::fopen("/proc/stat", "r");
  if (!stat) return 0;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                     steal = 0;
  const int read = std::fscanf(stat, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice,
                               &system, &idle, &iowait, &irq, &softirq, &steal);
  std::fclose(stat);
  if (read < 8) return 0;
  const double tick_ms = 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(user + nice + system + irq + softirq + steal) * tick_ms;
}

// What runs on the machine besides us: busy ms per second over an idle `window`.
double background_rate(std::chrono::milliseconds window) {
  const double before = machine_busy_ms();
  const auto begin = Clock::now();
  std::this_thread::sleep_for(window);
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  return (machine_busy_ms() - before) / seconds;
}

bool flag(const std::string& arg, const char* name, std::string& value) {
  const std::string prefix = std::string(name) + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  value = arg.substr(prefix.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  settings.rlm_sandbox =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "rlm-sandbox").string();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (flag(arg, "--samples", value))
      settings.samples = std::max(1L, std::atol(value.c_str()));
    else if (flag(arg, "--warmup", value))
      settings.warmup = std::atol(value.c_str());
    else if (flag(arg, "--pool", value))
      settings.pool = std::max(1L, std::atol(value.c_str()));
    else if (flag(arg, "--recycle", value))
      settings.recycle = std::max(2L, std::atol(value.c_str()));
    else if (flag(arg, "--seconds", value))
      settings.seconds = std::atof(value.c_str());
    else if (flag(arg, "--cost-runs", value))
      settings.cost_runs = std::max(4L, std::atol(value.c_str()));
    else if (flag(arg, "--rlm-sandbox", value))
      settings.rlm_sandbox = value;
    else if (flag(arg, "--bwrap", value))
      settings.bwrap = value;
    else {
      std::printf(
          "rlm-server-bench [--samples=N] [--warmup=N] [--pool=N] [--recycle=M] [--seconds=S]\n"
          "                 [--cost-runs=N] [--rlm-sandbox=PATH] [--bwrap=PATH]\n");
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }

  char directory[] = "/tmp/rlm-server-bench-XXXXXX";
  if (!mkdtemp(directory)) return 1;
  const std::string socket = std::string(directory) + "/s.sock";
  const std::string recycling = std::string(directory) + "/recycling.sock";
  // The servers are started by posix_spawn: the runtime's only fork/clone sites are
  // runtime/process/ and rlm-sandbox-init (docs/architecture.md).
  const std::string pool = "default=" + std::to_string(settings.pool);
  const std::string recycled_pool = pool + ",recycle=" + std::to_string(settings.recycle);
  const auto start_server = [&](const std::string& at, const std::string& spec) {
    const char* const server_argv[] = {settings.rlm_sandbox.c_str(),
                                       "serve",
                                       "--socket",
                                       at.c_str(),
                                       "--pool",
                                       spec.c_str(),
                                       nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, server_argv[0], nullptr, nullptr, const_cast<char* const*>(server_argv),
                    environ) != 0)
      std::fprintf(stderr, "rlm-server-bench: cannot start %s\n", server_argv[0]);
    return pid;
  };
  const pid_t servers[] = {start_server(socket, pool), start_server(recycling, recycled_pool)};
  const auto stop_server = [&] {
    for (pid_t server : servers) {
      if (server <= 0) continue;
      kill(server, SIGINT);  // stop at once (SIGTERM drains)
      waitpid(server, nullptr, 0);
    }
    std::filesystem::remove_all(directory);
  };
  if (servers[0] <= 0 || servers[1] <= 0 || !wait_for_full_pool(socket, settings.pool) ||
      !wait_for_full_pool(recycling, settings.pool)) {
    std::fprintf(stderr, "rlm-server-bench: the servers did not fill their pools\n");
    stop_server();
    return 1;
  }

  std::vector<Line> lines = {
      {"rlm-sandbox run --server",
       {settings.rlm_sandbox, "run", "--server", socket, "--policy", "default", "--", "/bin/true"},
       {},
       0,
       socket},
      {"bwrap", rlm::bench::bwrap_true(settings.bwrap), {}, 0, ""},
      {"rlm-sandbox run (cold)",
       {settings.rlm_sandbox, "run", "--policy", "default", "--", "/bin/true"},
       {},
       0,
       ""},
      {"library client via server", {}, {}, 0, socket},
      {"library, recycling server", {}, {}, 0, recycling},
  };
  for (long round = 0; round < settings.warmup + settings.samples; ++round)
    for (std::size_t k = 0; k < lines.size(); ++k) {
      Line& line = lines[(static_cast<std::size_t>(round) + k) % lines.size()];
      const auto ms = line.argv.empty() ? time_library_run(line.socket) : time_command(line.argv);
      if (!line.socket.empty()) wait_for_full_pool(line.socket, settings.pool);
      if (round < settings.warmup) continue;
      if (ms)
        line.ms.push_back(*ms);
      else
        ++line.failed;
    }

  double load[3] = {};
  getloadavg(load, 3);
  std::printf(
      "rlm-server-bench: %u CPUs, load %.2f %.2f %.2f; server pools default=%ld, and "
      "default=%ld,recycle=%ld\n\n",
      std::thread::hardware_concurrency(), load[0], load[1], load[2], settings.pool, settings.pool,
      settings.recycle);
  std::printf("  %-28s %8s %8s %8s %11s %7s %5s\n", "milliseconds", "median", "p99", "p99.9",
              "p99.9/med", "samples", "fail");
  for (const auto& line : lines) {
    const double median = rank_of(line.ms, 0.5);
    std::printf("  %-28s %8.2f %8.2f %8.2f %11.2f %7zu %5ld\n", line.name.c_str(), median,
                rank_of(line.ms, 0.99), rank_of(line.ms, 0.999),
                median > 0 ? rank_of(line.ms, 0.999) / median : 0.0, line.ms.size(), line.failed);
  }
  const double served = rank_of(lines[0].ms, 0.5), bwrap = rank_of(lines[1].ms, 0.5),
               cold = rank_of(lines[2].ms, 0.5), library_median = rank_of(lines[3].ms, 0.5),
               recycled_median = rank_of(lines[4].ms, 0.5);
  if (bwrap > 0) {
    std::printf("\n  server / bwrap median: %.2f  (target <= 0.50: %s)\n", served / bwrap,
                served / bwrap <= 0.5 ? "met" : "NOT met");
    std::printf("  library client via server / bwrap median: %.2f\n", library_median / bwrap);
    std::printf("  library, recycling server / bwrap median: %.2f\n", recycled_median / bwrap);
    std::printf("  cold / bwrap median:   %.2f  (target <= 1.00: %s)\n", cold / bwrap,
                cold / bwrap <= 1.0 ? "met" : "NOT met");
  }
  if (recycled_median > 0) {
    const double tail = rank_of(lines[4].ms, 0.999) / recycled_median;
    std::printf("  library, recycling server p99.9 / median: %.2f  (target <= 5: %s)\n", tail,
                tail <= 5 ? "met" : "NOT met");
  }

  // Throughput: burst from a full pool, then sustained.
  std::printf("\n  two clients in parallel, runs per second:\n");
  wait_for_full_pool(socket, settings.pool);
  const long burst_runs = settings.pool;
  const auto burst_until = [&](long runs, Clock::time_point) { return runs >= burst_runs; };
  const auto for_seconds = [&](long, Clock::time_point begin) {
    return std::chrono::duration<double>(Clock::now() - begin).count() >= settings.seconds;
  };
  const auto cli = [&] { return time_command(lines[0].argv); };
  const auto library = [&] { return time_library_run(socket); };
  const auto recycled_true = [&] { return time_library_run(recycling); };
  const auto recycled_python = [&] {
    return time_library_run(recycling, {"python3", "-c", "pass"});
  };
  const auto bwrap_python_line = rlm::bench::bwrap_line(settings.bwrap, {"python3", "-c", "pass"});
  const auto bwrap_python = [&] { return time_command(bwrap_python_line); };
  const auto bwrap_run = [&] { return time_command(lines[1].argv); };
  const double cli_burst = two_clients(cli, burst_until);
  wait_for_full_pool(socket, settings.pool);
  const double library_burst = two_clients(library, burst_until);
  wait_for_full_pool(socket, settings.pool);
  const double cli_sustained = two_clients(cli, for_seconds);
  wait_for_full_pool(socket, settings.pool);
  const double library_sustained = two_clients(library, for_seconds);
  const double bwraps = two_clients(bwrap_run, for_seconds);
  wait_for_full_pool(recycling, settings.pool);
  const double recycled_sustained = two_clients(recycled_true, for_seconds);
  const double bwraps_python = two_clients(bwrap_python, for_seconds);
  wait_for_full_pool(recycling, settings.pool);
  const double recycled_python_sustained = two_clients(recycled_python, for_seconds);
  // The ceiling of any sandbox: the same payloads with no sandbox at all (python3 as the sandboxes
  // resolve it: /usr/bin's).
  const std::vector<std::string> plain_true_line = {"/bin/true"},
                                 plain_python_line = {"/usr/bin/python3", "-c", "pass"};
  const double plain_true = two_clients([&] { return time_command(plain_true_line); }, for_seconds);
  const double plain_python =
      two_clients([&] { return time_command(plain_python_line); }, for_seconds);
  const std::string burst_name = " burst (" + std::to_string(burst_runs) + " runs, pool full)";
  std::printf("  %-48s %8.1f\n", ("CLI clients," + burst_name).c_str(), cli_burst);
  std::printf("  %-48s %8.1f\n", ("library clients," + burst_name).c_str(), library_burst);
  std::printf("  %-48s %8.1f\n", "CLI clients, sustained (refills included)", cli_sustained);
  std::printf("  %-48s %8.1f\n", "library clients, sustained (refills included)",
              library_sustained);
  std::printf("  %-48s %8.1f\n", "bwrap", bwraps);
  std::printf("  %-48s %8.1f\n", "library clients, recycling server, sustained",
              recycled_sustained);
  std::printf("  %-48s %8.1f\n", "bwrap, python3 -c pass", bwraps_python);
  std::printf("  %-48s %8.1f\n", "library, recycling server, python3 -c pass",
              recycled_python_sustained);
  std::printf("  %-48s %8.1f\n", "no sandbox (fork+exec), /bin/true", plain_true);
  std::printf("  %-48s %8.1f\n", "no sandbox (fork+exec), python3 -c pass", plain_python);
  if (bwraps > 0) {
    std::printf("  CLI clients / bwrap runs per second: burst %.2f, sustained %.2f\n",
                cli_burst / bwraps, cli_sustained / bwraps);
    std::printf(
        "  library clients / bwrap runs per second: burst %.2f (target >= 3: %s), "
        "sustained %.2f\n",
        library_burst / bwraps, library_burst / bwraps >= 3 ? "met" : "NOT met",
        library_sustained / bwraps);
    std::printf(
        "  recycling server / bwrap runs per second: /bin/true %.2f (target >= 2: %s), "
        "python3 -c pass %.2f (target >= 2: %s)\n",
        recycled_sustained / bwraps, recycled_sustained / bwraps >= 2 ? "met" : "NOT met",
        bwraps_python > 0 ? recycled_python_sustained / bwraps_python : 0.0,
        bwraps_python > 0 && recycled_python_sustained / bwraps_python >= 2 ? "met" : "NOT met");
    if (bwraps_python > 0)
      std::printf(
          "  no sandbox / bwrap runs per second (what a sandbox costing nothing would reach): "
          "/bin/true %.2f, python3 -c pass %.2f\n",
          plain_true / bwraps, plain_python / bwraps_python);
  }

  // The whole cost: machine-wide CPU per run, background subtracted.
  const std::vector<std::pair<std::string, std::vector<std::string>>> payloads = {
      {"/bin/true", {"/bin/true"}}, {"python3 -c pass", {"python3", "-c", "pass"}}};
  for (const auto& [payload_name, payload] : payloads) {
    struct CostLine {
      std::string name;
      std::vector<std::string> argv;  // empty: the library's client
      std::string socket;             // through this server ("": none)
      double busy_ms = 0;
      long runs = 0, failed = 0;
    };
    std::vector<std::string> cli_server = {settings.rlm_sandbox, "run",     "--server", socket,
                                           "--policy",           "default", "--"};
    std::vector<std::string> cli_cold = {settings.rlm_sandbox, "run", "--policy", "default", "--"};
    cli_server.insert(cli_server.end(), payload.begin(), payload.end());
    cli_cold.insert(cli_cold.end(), payload.begin(), payload.end());
    std::vector<std::string> cli_recycled = cli_server;
    cli_recycled[3] = recycling;
    std::vector<CostLine> cost = {{"rlm-sandbox run --server", cli_server, socket},
                                  {"library client via server", {}, socket},
                                  {"bwrap", rlm::bench::bwrap_line(settings.bwrap, payload), ""},
                                  {"rlm-sandbox run (cold)", cli_cold, ""},
                                  {"library, recycling server", {}, recycling},
                                  {"run --server, recycling server", cli_recycled, recycling}};
    const long block = std::max(1L, settings.cost_runs / 4);
    for (int round = 0; round < 4; ++round)
      for (std::size_t k = 0; k < cost.size(); ++k) {
        CostLine& line = cost[(static_cast<std::size_t>(round) + k) % cost.size()];
        if (!line.socket.empty()) wait_for_full_pool(line.socket, settings.pool);
        const double rate = background_rate(std::chrono::milliseconds(300));
        const double before = machine_busy_ms();
        const auto begin = Clock::now();
        for (long i = 0; i < block; ++i) {
          bool ok = false;
          if (line.argv.empty()) {
            rlm::Request request;
            request.argv = payload;
            try {
              ok = rlm::ServerConnection(line.socket).run(request, "default").status ==
                   rlm::Status::ok;
            } catch (const rlm::Error&) {
            }
          } else {
            ok = time_command(line.argv).has_value();
          }
          (ok ? line.runs : line.failed) += 1;
        }
        // The refill the block caused is part of what its runs cost.
        if (!line.socket.empty()) wait_for_full_pool(line.socket, settings.pool);
        const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        line.busy_ms += machine_busy_ms() - before - rate * seconds;
      }
    std::printf("\n  whole cost of %s, CPU ms per run (machine-wide, background subtracted):\n",
                payload_name.c_str());
    const double bwrap_cost =
        cost[2].runs ? cost[2].busy_ms / static_cast<double>(cost[2].runs) : 0;
    for (const auto& line : cost) {
      const double per_run = line.runs ? line.busy_ms / static_cast<double>(line.runs) : 0;
      std::printf("  %-32s %8.2f  %5.2fx bwrap  (%ld runs, %ld failed)\n", line.name.c_str(),
                  per_run, bwrap_cost > 0 ? per_run / bwrap_cost : 0.0, line.runs, line.failed);
    }
    if (payload_name == "/bin/true" && bwrap_cost > 0 && cost[4].runs) {
      const double ratio = cost[4].busy_ms / static_cast<double>(cost[4].runs) / bwrap_cost;
      std::printf("  library, recycling server / bwrap CPU per run: %.2f  (target <= 0.60: %s)\n",
                  ratio, ratio <= 0.6 ? "met" : "NOT met");
    }
  }
  stop_server();
  return 0;
}
