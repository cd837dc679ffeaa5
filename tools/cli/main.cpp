// rlm-sandbox: run untrusted code under a policy. Dispatches to the subcommands; every error ends
// as one clear message and an exit status from the contract in cli.hpp, never a stack trace.
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "rlm_sandbox/error.hpp"

namespace {

constexpr const char* kOverview = R"(rlm-sandbox: run code you do not trust, under a policy.

usage: rlm-sandbox COMMAND [OPTIONS]

commands:
  run       run a command or code in a sandbox and report what happened
  health    which backends work on this host, what each enforces, how to fix the rest
  doctor    the same as health
  policy    check, show or list policy files

Run 'rlm-sandbox COMMAND --help' for a command's options and examples.

examples:
  rlm-sandbox run -- python3 -c 'print(6 * 7)'
  rlm-sandbox run --policy strict --memory 64M --timeout 2s --json -- ./untrusted
  rlm-sandbox policy check my-policy.json
  rlm-sandbox health
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty()) {
    std::cerr << kOverview;
    return rlm::cli::kExitUsage;
  }
  const std::string command = words.front();
  const std::vector<std::string> rest(words.begin() + 1, words.end());
  try {
    if (command == "run") return rlm::cli::run_command(rest);
    if (command == "health" || command == "doctor") return rlm::cli::health_command(rest);
    if (command == "policy") return rlm::cli::policy_command(rest);
    if (command == "--help" || command == "-h" || command == "help") {
      std::cout << kOverview;
      return 0;
    }
    if (command == "--version") {
      std::cout << "rlm-sandbox " << RLM_SANDBOX_VERSION << "\n";
      return 0;
    }
    throw rlm::cli::UsageError("unknown command '" + command + "'", "");
  } catch (const rlm::cli::UsageError& e) {
    rlm::cli::print_error(std::string(e.what()) + " (see 'rlm-sandbox " +
                          (e.command.empty() ? "" : e.command + " ") + "--help')");
    return rlm::cli::kExitUsage;
  } catch (const rlm::Error& e) {
    rlm::cli::print_error(e.what());
    return rlm::cli::kExitSetup;
  } catch (const std::exception& e) {
    rlm::cli::print_error(std::string("internal error: ") + e.what());
    return rlm::cli::kExitSetup;
  }
}
