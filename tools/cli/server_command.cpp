// `rlm-sandbox server status` and `rlm-sandbox server kill ID`: what a running server does for
// this user (root and the server's own uid: for everyone), and ending one of its runs or sessions
// (docs/pools-and-server.md).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "cli.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox server status [--server PATH] [--json]
       rlm-sandbox server kill ID [--server PATH]
       rlm-sandbox server health|ready|capacity [--server PATH] [--json]
       rlm-sandbox server drain [--grace DURATION] [--server PATH]

Asks a running `rlm-sandbox serve` (at --server PATH, or $RLM_SANDBOX_SERVER):

  status    its pools (warm sandboxes and sessions ready, runs served warm and cold) and the runs
            and sessions it is running, each with its ID, owner (uid, gid, pid) and age. A client
            sees its own uid's; root and the server's own uid see everyone's.
  kill ID   ends run or session ID now. A run ends with status interrupted and an exit status of
            128+N; a session's cell in progress, and every later call, fail; each says who killed
            it. A client may kill only its own uid's; root and the server's uid any. Exit status
            0 when it was killed, 125 when there is no such run or session (of yours).

The node contract (docs/fleet.md), what an engine's probes and a fleet's client ask:

  health    whether the server answers at all: exit status 0 when it does.
  ready     whether it should be given work: not draining and every pool holding its minimum of
            warm sandboxes and sessions. Exit status 0 when ready, 1 when not (and why).
  capacity  node id, version, features (backends, cgroup version, Landlock ABI), cores, memory,
            --max-sandboxes, runs and sessions running and starting, idle warm sandboxes per pool,
            pressure (PSI), draining.
  drain     new runs and sessions are refused ("draining"), running ones get --grace (default the
            server's --drain-grace), then end with node_drained; the server then exits 0, as on
            SIGTERM. Root and the server's own uid only.

The server also logs one JSON line on its stderr for every request, refusal and end (journald
keeps them under the shipped unit: journalctl -u rlm-sandbox -o cat).
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox server status --server /run/rlm-sandbox.sock
  rlm-sandbox server status --server /run/rlm-sandbox.sock --json | jq '.running[].id'
  rlm-sandbox server kill 12 --server /run/rlm-sandbox.sock
  rlm-sandbox server ready --server /run/rlm-sandbox.sock || echo "not ready"
  rlm-sandbox server capacity --server /run/rlm-sandbox.sock --json | jq .running
  rlm-sandbox server drain --grace 60s --server /run/rlm-sandbox.sock
)";

std::string age_text(std::int64_t ms) {
  if (ms < 1000) return std::to_string(ms) + "ms";
  const std::int64_t s = ms / 1000;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
  return std::to_string(s / 3600) + "h" + std::to_string(s / 60 % 60) + "m";
}

void print_status(const nlohmann::json& status) {
  std::cout << "server pid " << status.value("pid", 0) << ", up "
            << age_text(status.value("uptime_ms", std::int64_t{0})) << "\n\npools:\n";
  const nlohmann::json pools = status.value("pools", nlohmann::json::object());
  for (const auto& [name, pool] : pools.items())
    std::cout << "  " << name << ": " << pool.value("ready_sandboxes", 0) << " sandboxes and "
              << pool.value("ready_sessions", 0) << " sessions ready; runs served "
              << pool.value("warm_runs", 0) << " warm, " << pool.value("cold_runs", 0)
              << " cold; sessions " << pool.value("warm_sessions", 0) << " warm, "
              << pool.value("cold_sessions", 0) << " cold\n";
  const auto& running = status["running"];
  std::cout << "\n"
            << (status.value("scope", "") == "all" ? "running (everyone's):" : "running (yours):")
            << (running.empty() ? " none\n" : "\n");
  if (running.empty()) return;
  char line[256];
  std::snprintf(line, sizeof line, "  %-6s %-8s %-20s %-8s %-8s %-8s %s\n", "ID", "OP", "POLICY",
                "UID", "GID", "PID", "AGE");
  std::cout << line;
  for (const auto& item : running) {
    std::string age = age_text(item.value("age_ms", std::int64_t{0}));
    if (item.value("killed", nlohmann::json()).is_string()) age += " (killed)";
    std::snprintf(line, sizeof line, "  %-6llu %-8s %-20s %-8llu %-8llu %-8lld %s\n",
                  static_cast<unsigned long long>(item.value("id", std::uint64_t{0})),
                  item.value("op", "").c_str(), item.value("policy", "").substr(0, 20).c_str(),
                  static_cast<unsigned long long>(item.value("uid", std::uint64_t{0})),
                  static_cast<unsigned long long>(item.value("gid", std::uint64_t{0})),
                  static_cast<long long>(item.value("pid", std::int64_t{0})), age.c_str());
    std::cout << line;
  }
}

void print_capacity(const nlohmann::json& capacity) {
  const auto& features = capacity["features"];
  std::cout << "node " << capacity.value("node_id", "") << " (rlm-sandbox "
            << capacity.value("version", "") << ")"
            << (capacity.value("draining", false) ? ", draining" : "")
            << (capacity.value("ready", false) ? ", ready" : ", not ready") << "\n";
  std::string backends;
  for (const auto& name : features.value("backends", nlohmann::json::array()))
    if (name.is_string()) backends += (backends.empty() ? "" : ", ") + name.get<std::string>();
  std::cout << "  backends: " << (backends.empty() ? "none" : backends) << "; cgroup "
            << features.value("cgroup", "?") << "; Landlock ABI "
            << features.value("landlock_abi", 0) << "\n";
  const auto gib = [&](const char* key) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB",
                  static_cast<double>(capacity.value(key, std::uint64_t{0})) / (1ull << 30));
    return std::string(text);
  };
  std::cout << "  cores " << capacity.value("cores", 0) << ", memory " << gib("memory_bytes")
            << " (" << gib("memory_available_bytes") << " available)\n";
  const auto max = capacity.value("max_sandboxes", std::uint64_t{0});
  std::cout << "  running " << capacity.value("running", 0) << ", starting "
            << capacity.value("starting", 0) << " of "
            << (max ? std::to_string(max) : std::string("no cap (--max-sandboxes)")) << "\n";
  const nlohmann::json pools = capacity.value("warm_idle", nlohmann::json::object());
  for (const auto& [name, pool] : pools.items())
    std::cout << "  pool " << name << ": " << pool.value("sandboxes", 0) << "/"
              << pool.value("min_sandboxes", 0) << " warm sandboxes, " << pool.value("sessions", 0)
              << "/" << pool.value("min_sessions", 0) << " warm sessions idle\n";
  const auto pressure = capacity.value("pressure", nlohmann::json::object());
  std::cout << "  pressure (some, avg10):";
  for (const char* resource : {"cpu", "memory", "io"}) {
    const auto value = pressure.value(resource, nlohmann::json());
    std::cout << " " << resource << " "
              << (value.is_number() ? std::to_string(value.get<double>()).substr(0, 5) + "%"
                                    : std::string("n/a"));
  }
  std::cout << std::endl;
}

}  // namespace

int server_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()                                             //
      ("help,h", "show this help")                                  //
      ("server", po::value<std::string>(), kServerFlagHelp)         //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp)  //
      ("json", po::bool_switch(),
       "status, health, ready, capacity: print the server's answer as one JSON object")  //
      ("grace", po::value<std::string>(),
       "drain: how long running work may go on (default the server's --drain-grace)");
  add_tls_flags(options);
  po::options_description all;
  all.add(options).add_options()("args", po::value<std::vector<std::string>>(), "");
  auto values = parse_options(args, all, "server", "args");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  const auto words = values.count("args") ? values["args"].as<std::vector<std::string>>()
                                          : std::vector<std::string>{};
  if (words.empty())
    throw UsageError("expected status, kill ID, health, ready, capacity or drain", "server");
  const auto socket = server_socket(values);
  if (!socket)
    throw UsageError("which server? give --server PATH (or set RLM_SANDBOX_SERVER)", "server");
  const std::string& action = words.front();
  if (action == "status") {
    if (words.size() != 1) throw UsageError("status takes no argument", "server");
    ServerConnection connection(*socket, server_uid(values), tls_files(values));
    const auto status = connection.status();
    if (values["json"].as<bool>())
      std::cout << status.dump() << std::endl;
    else
      print_status(status);
    return 0;
  }
  if (action == "kill") {
    if (words.size() != 2) throw UsageError("kill takes one ID (from server status)", "server");
    const std::string& text = words[1];
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
        text.size() > 19)
      throw BadFlagValue("kill " + text + ": an ID is a number from `rlm-sandbox server status`");
    ServerConnection connection(*socket, server_uid(values), tls_files(values));
    connection.kill(std::stoull(text));
    std::cout << "killed " << text << std::endl;
    return 0;
  }
  if (action == "health" || action == "ready" || action == "capacity" || action == "drain") {
    if (words.size() != 1) throw UsageError(action + " takes no argument", "server");
    if (values.count("grace") && action != "drain")
      throw UsageError("--grace goes with drain only", "server");
    ServerConnection connection(*socket, server_uid(values), tls_files(values));
    const bool json_out = values["json"].as<bool>();
    if (action == "health") {
      const auto health = connection.health();
      if (json_out)
        std::cout << health.dump() << std::endl;
      else
        std::cout << "node " << health.value("node", "") << " (pid " << health.value("pid", 0)
                  << ") is alive" << std::endl;
      return 0;
    }
    if (action == "ready") {
      const auto ready = connection.ready();
      const bool is_ready = ready.value("ready", false);
      if (json_out) {
        std::cout << ready.dump() << std::endl;
      } else {
        std::cout << "node " << ready.value("node", "")
                  << (is_ready ? " is ready" : " is not ready") << std::endl;
        for (const auto& why : ready.value("why", nlohmann::json::array()))
          if (why.is_string()) std::cout << "  " << why.get<std::string>() << "\n";
      }
      return is_ready ? 0 : 1;
    }
    if (action == "capacity") {
      const auto capacity = connection.capacity();
      if (json_out)
        std::cout << capacity.dump() << std::endl;
      else
        print_capacity(capacity);
      return 0;
    }
    std::optional<std::chrono::milliseconds> grace;
    if (values.count("grace")) grace = duration_flag("--grace", values["grace"].as<std::string>());
    const auto draining = connection.drain(grace);
    std::cout << "node " << draining.value("node", "") << " is draining; running work has "
              << format_duration(std::chrono::milliseconds(draining.value("grace_ms", 0)))
              << std::endl;
    return 0;
  }
  throw UsageError(
      "unknown action '" + action + "'; expected status, kill ID, health, ready, capacity or drain",
      "server");
}

}  // namespace rlm::cli
