// `rlm-sandbox health` (and `doctor`): what works on this host, what each backend enforces here,
// and the command that fixes what does not work.
#include <iostream>

#include "cli.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox health [--json] [--policy NAME|FILE]

Tells which backends work on this host, which policy limits each one enforces here and which it
cannot, and for each missing piece the command that fixes it.
With --policy, also tells which backend a run under that policy would use, and exits 1 when no
backend can run it (the run would fail closed with exit 125).

For the namespace backend, "host setup" names which of the setups of docs/cgroups.md this host is:
  root-cgroup-v1            root on a cgroup v1 (or hybrid) host
  root-cgroup-v2            root on a cgroup v2 host; rlm-sandbox enables the controllers it needs
  user-delegated-cgroup-v2  an ordinary user with a delegated cgroup v2 subtree
  user-no-cgroup            an ordinary user without a writable cgroup: rlimits stand in for the
                            memory and pids limits (listed under "falls back to"), and the "to fix"
                            line says how to get a delegated subtree

examples:
  rlm-sandbox health
  rlm-sandbox health --json
  rlm-sandbox health --policy strict
)";

Health health_of(const std::string& name) {
  if (auto backend = make_backend(name)) return backend->health();
  Health missing;
  missing.backend = name;
  missing.detail = "not part of this build of rlm-sandbox yet";
  return missing;
}

void print_list(const char* label, const std::vector<std::string>& items) {
  if (items.empty()) return;
  std::cout << "    " << label << ":";
  for (const auto& item : items) std::cout << " " << item;
  std::cout << "\n";
}

}  // namespace

int health_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()                                                     //
      ("help,h", "show this help")                                          //
      ("json", po::bool_switch(), "print one JSON object instead of text")  //
      ("policy,p", po::value<std::string>(), "also tell which backend would run this policy");
  auto values = parse_options(args, options, "health");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options;
    return 0;
  }

  nlohmann::json report = {{"backends", nlohmann::json::array()}};
  std::vector<Health> healths;
  for (const auto& name : known_backend_names()) {
    healths.push_back(health_of(name));
    report["backends"].push_back(healths.back().to_json());
  }

  int exit_code = 0;
  std::string selection_line;
  if (values.count("policy")) {
    Policy policy = load_policy(values["policy"].as<std::string>());
    nlohmann::json selection = {{"policy", policy.name}};
    try {
      auto backend = select_backend(policy);
      selection["backend"] = std::string(backend->name());
      selection_line =
          "policy " + policy.name + " runs on the " + std::string(backend->name()) + " backend";
    } catch (const BackendUnavailable& e) {
      selection["backend"] = nullptr;
      selection["error"] = e.what();
      selection_line = e.what();
      exit_code = 1;
    }
    report["selection"] = selection;
  }

  if (values["json"].as<bool>()) {
    std::cout << report.dump(2) << "\n";
    return exit_code;
  }
  for (const auto& health : healths) {
    std::cout << health.backend << ": " << (health.available ? "available" : "unavailable")
              << (health.available && !health.isolated ? " (no isolation)" : "") << "\n";
    std::cout << "    " << health.detail << "\n";
    if (health.host.is_object() && health.host.contains("setup"))
      std::cout << "    host setup: " << health.host["setup"].get<std::string>() << "\n";
    for (const auto& [field, how] : health.fallbacks)
      std::cout << "    " << field << " falls back to " << how << "\n";
    if (!health.fix.empty()) std::cout << "    to fix: " << health.fix << "\n";
    print_list("enforces", health.enforced);
    print_list("does not enforce", health.unenforced);
  }
  if (!selection_line.empty()) std::cout << "\n" << selection_line << "\n";
  return exit_code;
}

}  // namespace rlm::cli
