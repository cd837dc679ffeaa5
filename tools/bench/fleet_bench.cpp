// rlm-fleet-bench: what placement in the client costs against a fleet of simulated nodes
// (docs/fleet.md, "Design limits"), public API only. Each simulated node is a unix socket that
// answers the node contract's `capacity` (a cap of 8, a load that moves) and `run` (it takes the
// three fds, closes them and answers started and an ok result at once, or refuses the run as
// resource_exhausted when its simulated load is full); a few threads serve all of them. Measured,
// interleaved:
//   direct_run        ServerConnection::run on one simulated node: the protocol's own cost
//   fleet_run/N       Fleet::run over N simulated nodes: K = 3 capacity asks, the run, and the
//                     retries that refusals cost
// with the capacity asks per request, and per node per 1,000 requests (the poll traffic a node
// sees), as counters; and read_fleet of a directory of N endpoint files.
//
// Then real nodes: `rlm-sandbox serve` (next to this binary) three times, registered in one
// directory, and once alone, each with 4 warm sandboxes and 2 warm sessions; in interleaved
// rounds of --seconds each: two client threads running /bin/true back to back through
// Fleet::run on the three against ServerConnection::run on the one (runs per second; the nodes of
// this machine share its cores, so three are not three machines), and a session opened and its
// first cell run through the fleet against the same on the one node (median ms).
//
// And remote access: the lone node also listens for TLS (--listen 127.0.0.1:0, certificates made
// by tests/server/make_tls_certs.sh); /bin/true run through tls://127.0.0.1:PORT and through the
// unix socket, one at a time, in turns (unix, tls, tls, unix, ...: each goes first as often, since
// the second of a pair finds the node refilling the pool the first drew from): the median of each
// and their difference (what TLS, its kept connection, and the streamed stdio add to a run).
//
//   rlm-fleet-bench [--nodes=N] [--seconds=S] [--rounds=R] [Google Benchmark flags...]
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/fleet.hpp"
#include "rlm_sandbox/session.hpp"

namespace {

using nlohmann::json;

extern "C" char** environ;

std::size_t g_nodes = 1000;
double g_seconds = 3;
int g_rounds = 3;
constexpr std::size_t kServingThreads = 4;
constexpr std::uint64_t kCap = 8;

struct SimulatedNode {
  int listener = -1;
  std::string socket;
  std::atomic<std::uint64_t> capacity_asks{0}, runs{0}, refusals{0};
  // What the node reports as running moves with every ask (0 to the cap, a busy fleet where about
  // one node in nine is full); one run in ten is refused, as if another client took the last slot
  // between the ask and the run.
  std::atomic<std::uint64_t> load{0};
};

// One frame: 4-byte big-endian length, then JSON; fds that came with it are closed.
bool read_frame(int fd, json& message) {
  char header[4];
  char control[CMSG_SPACE(sizeof(int) * 4)];
  iovec io{header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  std::size_t got = 0;
  const ssize_t first = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (first <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_type == SCM_RIGHTS) {
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int fds[4];
      std::memcpy(fds, CMSG_DATA(c), count * sizeof(int));
      for (std::size_t i = 0; i < count; ++i) close(fds[i]);
    }
  got = static_cast<std::size_t>(first);
  while (got < 4) {
    const ssize_t n = read(fd, header + got, 4 - got);
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  const std::uint32_t size = (std::uint32_t(std::uint8_t(header[0])) << 24) |
                             (std::uint32_t(std::uint8_t(header[1])) << 16) |
                             (std::uint32_t(std::uint8_t(header[2])) << 8) |
                             std::uint32_t(std::uint8_t(header[3]));
  if (size > (1u << 20)) return false;
  std::string body(size, '\0');
  for (std::size_t at = 0; at < size;) {
    const ssize_t n = read(fd, body.data() + at, size - at);
    if (n <= 0) return false;
    at += static_cast<std::size_t>(n);
  }
  message = json::parse(body, nullptr, false);
  return message.is_object();
}

void write_frame(int fd, const json& message) {
  const std::string body = message.dump();
  const std::uint32_t size = static_cast<std::uint32_t>(body.size());
  std::string bytes = {char(size >> 24), char(size >> 16), char(size >> 8), char(size)};
  bytes += body;
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
  }
}

void answer(SimulatedNode& node, int connection) {
  json request;
  if (!read_frame(connection, request)) return;
  const std::string op = request.value("op", "");
  if (op == "capacity") {
    const std::uint64_t load = node.capacity_asks++ * 7 + node.load;
    write_frame(connection, {{"op", "capacity"},
                             {"node_id", node.socket},
                             {"features", {{"backends", {"namespace"}}}},
                             {"max_sandboxes", kCap},
                             {"running", load % (kCap + 1)},
                             {"starting", 0},
                             {"warm_idle", json::object()},
                             {"draining", false},
                             {"ready", true}});
  } else if (op == "run") {
    if (++node.load % 10 == 0) {
      ++node.refusals;
      write_frame(connection,
                  {{"op", "error"}, {"kind", "resource_exhausted"}, {"message", "simulated"}});
      return;
    }
    ++node.runs;
    write_frame(connection, {{"op", "started"}, {"policy", "default"}, {"output_bytes", 1024}});
    write_frame(connection,
                {{"op", "result"},
                 {"result", {{"status", "ok"}, {"exit_code", 0}, {"node", node.socket}}}});
  }
}

class SimulatedFleet {
 public:
  explicit SimulatedFleet(std::size_t count) {
    directory_ =
        std::filesystem::temp_directory_path() / ("rlm-fleet-bench-" + std::to_string(getpid()));
    std::filesystem::create_directories(directory_ / "nodes");
    for (std::size_t i = 0; i < count; ++i) {
      auto node = std::make_unique<SimulatedNode>();
      node->socket = (directory_ / ("n" + std::to_string(i) + ".sock")).string();
      node->listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, node->socket.c_str(), sizeof address.sun_path - 1);
      if (node->listener < 0 ||
          bind(node->listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
          listen(node->listener, 64) != 0) {
        // What was made so far goes (a throw out of a constructor runs no destructor).
        if (node->listener >= 0) close(node->listener);
        for (auto& made : nodes_) close(made->listener);
        std::filesystem::remove_all(directory_);
        throw std::runtime_error("cannot listen at " + node->socket);
      }
      std::ofstream(directory_ / "nodes" / ("n" + std::to_string(i) + ".endpoint"))
          << "unix:" << node->socket << "\n";
      nodes_.push_back(std::move(node));
    }
    for (std::size_t t = 0; t < kServingThreads; ++t)
      threads_.emplace_back([this, t] { serve(t); });
  }
  ~SimulatedFleet() {
    stop_ = true;
    for (auto& thread : threads_) thread.join();
    for (auto& node : nodes_) close(node->listener);
    std::filesystem::remove_all(directory_);
  }
  std::string registry() const { return (directory_ / "nodes").string(); }
  SimulatedNode& node(std::size_t i) { return *nodes_[i]; }
  std::uint64_t capacity_asks() const {
    std::uint64_t total = 0;
    for (const auto& node : nodes_) total += node->capacity_asks;
    return total;
  }
  std::size_t size() const { return nodes_.size(); }

 private:
  void serve(std::size_t part) {
    std::vector<pollfd> fds;
    std::vector<SimulatedNode*> owners;
    for (std::size_t i = part; i < nodes_.size(); i += kServingThreads) {
      fds.push_back({nodes_[i]->listener, POLLIN, 0});
      owners.push_back(nodes_[i].get());
    }
    while (!stop_) {
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        const int connection = accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (connection < 0) continue;
        answer(*owners[i], connection);
        close(connection);
      }
    }
  }
  std::filesystem::path directory_;
  std::vector<std::unique_ptr<SimulatedNode>> nodes_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

SimulatedFleet* g_fleet = nullptr;

rlm::Request true_request() {
  rlm::Request request;
  request.argv = {"/bin/true"};
  return request;
}

void direct_run(benchmark::State& state) {
  const std::string socket = g_fleet->node(0).socket;
  const rlm::Request request = true_request();
  for (auto _ : state) {
    g_fleet->node(0).load = 1;  // never refuses
    benchmark::DoNotOptimize(rlm::ServerConnection(socket).run(request, "default"));
  }
}

void fleet_run(benchmark::State& state) {
  rlm::Fleet fleet(rlm::read_fleet(g_fleet->registry()));
  const rlm::Request request = true_request();
  const std::uint64_t asks_before = g_fleet->capacity_asks();
  std::uint64_t requests = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(fleet.run(request, "default"));
    ++requests;
  }
  const double asks = static_cast<double>(g_fleet->capacity_asks() - asks_before);
  state.counters["asks_per_request"] = asks / static_cast<double>(requests);
  state.counters["asks_per_node_per_1k_requests"] =
      asks / static_cast<double>(g_fleet->size()) * 1000.0 / static_cast<double>(requests);
}

void read_registry(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(rlm::read_fleet(g_fleet->registry()));
  state.counters["nodes"] = static_cast<double>(g_fleet->size());
}

// ---- Real nodes ----

using Clock = std::chrono::steady_clock;

class RealNodes {
 public:
  RealNodes() {
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    binary_ = std::filesystem::path(std::string(self, n > 0 ? n : 0)).parent_path() / "rlm-sandbox";
    directory_ = std::filesystem::temp_directory_path() /
                 ("rlm-fleet-bench-real-" + std::to_string(getpid()));
    std::filesystem::create_directories(directory_ / "fleet");
    for (int i = 1; i <= 3; ++i)
      start((directory_ / ("n" + std::to_string(i) + ".sock")).string(), "n" + std::to_string(i),
            true);
    alone_ = (directory_ / "alone.sock").string();
    const std::string certs = (directory_ / "tls").string();
    const std::string script = std::string(RLM_SOURCE_DIR) + "/tests/server/make_tls_certs.sh";
    tls_ = std::system(("/bin/sh '" + script + "' '" + certs + "'").c_str()) == 0;
    if (tls_) tls_files_ = {certs + "/alice.pem", certs + "/alice.key", certs + "/ca.pem"};
    start(alone_, "alone", false,
          tls_ ? std::vector<std::string>{"--listen", "127.0.0.1:0", "--tls-cert",
                                          certs + "/node.pem", "--tls-key", certs + "/node.key",
                                          "--client-ca", certs + "/ca.pem", "--tls-identity",
                                          "alice=" + std::to_string(getuid())}
               : std::vector<std::string>{});
  }
  ~RealNodes() {
    for (const pid_t pid : pids_) kill(pid, SIGINT);
    for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
    std::filesystem::remove_all(directory_);
  }
  bool usable() const { return usable_; }
  std::string registry() const { return (directory_ / "fleet").string(); }
  const std::string& alone() const { return alone_; }
  // The lone node's TLS endpoint ("" when the certificates could not be made) and our files.
  const std::string& alone_tls() const { return alone_tls_; }
  const rlm::TlsFiles& tls_files() const { return tls_files_; }

 private:
  void start(const std::string& socket, const std::string& id, bool registered,
             const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        binary_.string(), "serve",     "--socket",       socket,         "--node-id", id,
        "--pool",         "default=4", "--session-pool", "python-repl=2"};
    if (registered) args.insert(args.end(), {"--register", registry()});
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string log = (directory_ / (id + ".log")).string();
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) usable_ = false;
    posix_spawn_file_actions_destroy(&actions);
    if (pid > 0) pids_.push_back(pid);
    // Ready: its pools full.
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      try {
        if (rlm::ServerConnection(socket).ready().value("ready", false)) {
          if (!extra.empty()) alone_tls_ = tls_address(log);
          return;
        }
      } catch (const rlm::Error&) {
      }
      if (Clock::now() > deadline) {
        usable_ = false;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // "tls://ADDRESS" from the server's "listening" line.
  static std::string tls_address(const std::string& log) {
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      const json event = json::parse(line, nullptr, false);
      if (!event.is_discarded() && event.value("event", "") == "listening" &&
          event.value("tls", json()).is_string())
        return "tls://" + event["tls"].get<std::string>();
    }
    return "";
  }
  std::filesystem::path binary_, directory_;
  std::string alone_, alone_tls_;
  bool tls_ = false;
  rlm::TlsFiles tls_files_;
  std::vector<pid_t> pids_;
  bool usable_ = true;
};

// Runs per second of two threads running /bin/true back to back for g_seconds through `run`.
double runs_per_second(const std::function<void()>& run) {
  std::atomic<std::uint64_t> done{0};
  const auto end = Clock::now() + std::chrono::duration<double>(g_seconds);
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t)
    clients.emplace_back([&] {
      while (Clock::now() < end) {
        run();
        ++done;
      }
    });
  for (auto& client : clients) client.join();
  return static_cast<double>(done) / g_seconds;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

double session_first_cell_ms(const std::function<std::unique_ptr<rlm::Session>()>& open) {
  std::vector<double> samples;
  for (int i = 0; i < 10; ++i) {
    const auto start = Clock::now();
    auto session = open();
    session->execute("x = 1");
    samples.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    session->close();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the pools refill
  }
  return median(samples);
}

void real_nodes() {
  RealNodes nodes;
  if (!nodes.usable()) {
    std::printf("\nreal nodes: skipped (rlm-sandbox serve did not come up ready)\n");
    return;
  }
  rlm::Fleet fleet(rlm::read_fleet(nodes.registry()));
  rlm::Request request;
  request.argv = {"/bin/true"};
  std::printf("\nreal nodes (interleaved rounds of %.0f s, two client threads):\n", g_seconds);
  std::printf("%-8s %-22s %-22s %-10s %-18s %-18s\n", "round", "one node runs/s",
              "3 nodes --fleet runs/s", "ratio", "one: open+cell ms", "fleet: open+cell ms");
  for (int round = 1; round <= g_rounds; ++round) {
    const double one = runs_per_second([&] {
      benchmark::DoNotOptimize(rlm::ServerConnection(nodes.alone()).run(request, "default"));
    });
    const double three =
        runs_per_second([&] { benchmark::DoNotOptimize(fleet.run(request, "default")); });
    const double one_open = session_first_cell_ms([&] {
      return rlm::ServerConnection(nodes.alone()).open_session("python-repl", nullptr, {});
    });
    const double fleet_open =
        session_first_cell_ms([&] { return fleet.open_session("python-repl", nullptr, {}); });
    std::printf("%-8d %-22.0f %-22.0f %-10.2f %-18.1f %-18.1f\n", round, one, three, three / one,
                one_open, fleet_open);
  }
  if (nodes.alone_tls().empty()) {
    std::printf(
        "\nremote access: skipped (no TLS listener: the certificates or --listen failed)\n");
    return;
  }
  // One run at a time, in turns, so both see the same machine; each pair's order swaps, so that
  // neither always comes second, into the pool refill the first one started.
  std::printf("\nremote access: /bin/true, one at a time, in turns ABBA (%d rounds of 200 each)\n",
              g_rounds);
  std::printf("%-8s %-16s %-16s %-12s\n", "round", "unix median ms", "tls median ms", "tls - unix");
  const auto timed = [](const std::function<void()>& run) {
    const auto start = Clock::now();
    run();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (int round = 1; round <= g_rounds; ++round) {
    std::vector<double> unix_ms, tls_ms;
    const auto through_unix = [&] {
      unix_ms.push_back(timed([&] {
        benchmark::DoNotOptimize(rlm::ServerConnection(nodes.alone()).run(request, "default"));
      }));
    };
    const auto through_tls = [&] {
      tls_ms.push_back(timed([&] {
        benchmark::DoNotOptimize(
            rlm::ServerConnection(nodes.alone_tls(), std::nullopt, nodes.tls_files())
                .run(request, "default"));
      }));
    };
    for (int i = 0; i < 200; ++i) {
      if (i % 2 == 0) {
        through_unix();
        through_tls();
      } else {
        through_tls();
        through_unix();
      }
    }
    const double unix_median = median(unix_ms), tls_median = median(tls_ms);
    std::printf("%-8d %-16.2f %-16.2f %+.2f ms\n", round, unix_median, tls_median,
                tls_median - unix_median);
  }
}

int bench(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--nodes=", 8) == 0) {
      g_nodes = std::strtoul(argv[i] + 8, nullptr, 10);
      continue;
    }
    if (std::strncmp(argv[i], "--seconds=", 10) == 0) {
      g_seconds = std::max(0.5, std::strtod(argv[i] + 10, nullptr));
      continue;
    }
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) {
      g_rounds = std::max(1, std::atoi(argv[i] + 9));
      continue;
    }
    rest.push_back(argv[i]);
  }
  if (g_nodes == 0) g_nodes = 1;
  int count = static_cast<int>(rest.size());
  benchmark::Initialize(&count, rest.data());
  {
    SimulatedFleet fleet(g_nodes);
    g_fleet = &fleet;
    // Interleaved: the direct run and the fleet's alternate, so a loaded moment costs both.
    for (int round = 0; round < 3; ++round) {
      benchmark::RegisterBenchmark("direct_run", direct_run)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("fleet_run/" + std::to_string(g_nodes)).c_str(), fleet_run)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("read_fleet/" + std::to_string(g_nodes)).c_str(), read_registry)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_fleet = nullptr;
  }
  real_nodes();
  return 0;
}

}  // namespace

// Whatever a benchmark throws is caught here, so that the simulated nodes' and the real servers'
// destructors run: their sockets, servers and temporary directories go with them.
int main(int argc, char** argv) {
  try {
    return bench(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rlm-fleet-bench: %s\n", error.what());
    return 1;
  }
}
