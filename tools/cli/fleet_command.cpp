// `rlm-sandbox fleet status SOURCE`: each node of a fleet as its capacity says (docs/fleet.md).
#include <cstdio>
#include <iostream>
#include <string>

#include "cli.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/fleet.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox fleet status SOURCE [--json]

Asks every node of a fleet of `rlm-sandbox serve` nodes for its capacity (the node contract,
docs/fleet.md) and prints one line per node: its id, whether it is ready, what it runs and holds
warm, its cap (--max-sandboxes) and whether it drains. SOURCE is what `run --fleet` and
`repl --fleet` take: a file of endpoints (unix:PATH or tls://HOST:PORT, one per line, '#'
comments), a directory of NODE.endpoint files that nodes write themselves
(`serve --register DIR`), or slurm:PORT (the TLS listener on PORT of each host in
$SLURM_JOB_NODELIST). tls:// nodes are asked with --tls-cert, --tls-key and --tls-ca.

Exit status 0 when every node answered, 1 when one or more did not (each is listed with why).
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox fleet status /shared/rlm-nodes/
  rlm-sandbox fleet status fleet.txt --json | jq '.[] | {node_id, running}'
  rlm-sandbox fleet status slurm:7443 --tls-cert me.pem --tls-key me.key --tls-ca ca.pem
)";

std::string count_text(const nlohmann::json& value) {
  return value.is_number() ? value.dump() : "-";
}

// A node's words as a terminal may show them: printable ASCII only, at most `width` of it.
std::string printable(const nlohmann::json& value, std::size_t width) {
  const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  std::string out;
  for (const char c : text)
    if (out.size() < width) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

void print_table(const std::vector<FleetNode>& nodes) {
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-6s %-8s %-8s %-6s %-6s %-9s %s\n", "NODE", "READY",
                "RUNNING", "STARTING", "MAX", "WARM", "DRAINING", "ENDPOINT");
  std::cout << line;
  for (const auto& node : nodes) {
    if (!node.capacity) {
      std::snprintf(line, sizeof line, "%-20s %-6s %-8s %-8s %-6s %-6s %-9s %s\n", "?", "down", "-",
                    "-", "-", "-", "-", node.endpoint.c_str());
      std::cout << line << "  " << node.error << "\n";
      continue;
    }
    // A node's answer is another machine's: a field of another type makes that one line say so.
    try {
      const auto& capacity = *node.capacity;
      std::uint64_t warm = 0;
      const nlohmann::json pools = capacity.value("warm_idle", nlohmann::json::object());
      for (const auto& [name, pool] : pools.items())
        if (pool.is_object())
          warm +=
              pool.value("sandboxes", std::uint64_t{0}) + pool.value("sessions", std::uint64_t{0});
      const auto max = capacity.value("max_sandboxes", std::uint64_t{0});
      std::snprintf(line, sizeof line, "%-20s %-6s %-8s %-8s %-6s %-6llu %-9s %s\n",
                    printable(capacity.value("node_id", nlohmann::json("?")), 20).c_str(),
                    capacity.value("ready", false) ? "yes" : "no",
                    count_text(capacity.value("running", nlohmann::json())).c_str(),
                    count_text(capacity.value("starting", nlohmann::json())).c_str(),
                    max ? std::to_string(max).c_str() : "-", static_cast<unsigned long long>(warm),
                    capacity.value("draining", false) ? "yes" : "no", node.endpoint.c_str());
    } catch (const std::exception&) {
      std::snprintf(line, sizeof line, "%-20s %-6s %s\n  its capacity answer is malformed\n", "?",
                    "?", node.endpoint.c_str());
    }
    std::cout << line;
  }
  std::cout.flush();
}

}  // namespace

int fleet_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()                                             //
      ("help,h", "show this help")                                  //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp)  //
      ("json", po::bool_switch(),
       "print a JSON array of the nodes' capacities (each with \"endpoint\"; a node that did not "
       "answer: {\"endpoint\", \"error\"})");
  add_tls_flags(options);
  po::options_description all;
  all.add(options).add_options()("args", po::value<std::vector<std::string>>(), "");
  auto values = parse_options(args, all, "fleet", "args");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  const auto words = values.count("args") ? values["args"].as<std::vector<std::string>>()
                                          : std::vector<std::string>{};
  if (words.empty()) throw UsageError("expected status SOURCE", "fleet");
  if (words.front() != "status")
    throw UsageError("unknown action '" + words.front() + "'; expected status SOURCE", "fleet");
  if (words.size() != 2)
    throw UsageError(
        "status takes one SOURCE: a file of endpoints, a directory of them, or slurm:PORT",
        "fleet");
  FleetOptions fleet_options;
  fleet_options.server_uid = server_uid(values);
  fleet_options.tls = tls_files(values);
  const Fleet fleet(read_fleet(words[1]), fleet_options);
  const auto nodes = fleet.status();
  if (values["json"].as<bool>()) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& node : nodes) array.push_back(node.to_json());
    std::cout << array.dump() << std::endl;
  } else {
    print_table(nodes);
  }
  for (const auto& node : nodes)
    if (!node.capacity) return 1;
  return 0;
}

}  // namespace rlm::cli
