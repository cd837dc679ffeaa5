// `rlm-sandbox server status` and `rlm-sandbox server kill ID`: what a running server does for
// this user (root and the server's own uid: for everyone), and ending one of its runs or sessions
// (docs/pools-and-server.md).
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox server status [--server PATH] [--json]
       rlm-sandbox server kill ID [--server PATH]

Asks a running `rlm-sandbox serve` (at --server PATH, or $RLM_SANDBOX_SERVER):

  status    its pools (warm sandboxes and sessions ready, runs served warm and cold) and the runs
            and sessions it is running, each with its ID, owner (uid, gid, pid) and age. A client
            sees its own uid's; root and the server's own uid see everyone's.
  kill ID   ends run or session ID now. A run ends with status interrupted and an exit status of
            128+N; a session's cell in progress, and every later call, fail; each says who killed
            it. A client may kill only its own uid's; root and the server's uid any. Exit status
            0 when it was killed, 125 when there is no such run or session (of yours).

The server also logs one JSON line on its stderr for every request, refusal and end (journald
keeps them under the shipped unit: journalctl -u rlm-sandbox -o cat).
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox server status --server /run/rlm-sandbox.sock
  rlm-sandbox server status --server /run/rlm-sandbox.sock --json | jq '.running[].id'
  rlm-sandbox server kill 12 --server /run/rlm-sandbox.sock
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

}  // namespace

int server_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()                                             //
      ("help,h", "show this help")                                  //
      ("server", po::value<std::string>(), kServerFlagHelp)         //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp)  //
      ("json", po::bool_switch(), "status: print the server's answer as one JSON object");
  po::options_description all;
  all.add(options).add_options()("args", po::value<std::vector<std::string>>(), "");
  auto values = parse_options(args, all, "server", "args");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  const auto words = values.count("args") ? values["args"].as<std::vector<std::string>>()
                                          : std::vector<std::string>{};
  if (words.empty()) throw UsageError("expected status or kill ID", "server");
  const auto socket = server_socket(values);
  if (!socket)
    throw UsageError("which server? give --server PATH (or set RLM_SANDBOX_SERVER)", "server");
  const std::string& action = words.front();
  if (action == "status") {
    if (words.size() != 1) throw UsageError("status takes no argument", "server");
    ServerConnection connection(*socket, server_uid(values));
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
    ServerConnection connection(*socket, server_uid(values));
    connection.kill(std::stoull(text));
    std::cout << "killed " << text << std::endl;
    return 0;
  }
  throw UsageError("unknown action '" + action + "'; expected status or kill ID", "server");
}

}  // namespace rlm::cli
