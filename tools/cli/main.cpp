// rlm-sandbox: run untrusted code under a policy. Dispatches to the subcommands; every error ends
// as one clear message and an exit status from the contract in cli.hpp, never a stack trace.
#include <unistd.h>

#include <filesystem>
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
  repl      a persistent sandboxed Python session driven over JSON lines (for RLM loops)
  serve     keep warm sandboxes for run/repl --server behind a unix socket
  server    status / kill ID: what a running server runs, with owner and age; end one;
            health / ready / capacity / drain: the server as a fleet's node
  fleet     status SOURCE: every node of a fleet, as its capacity says
  health    which backends work on this host, what each enforces, how to fix the rest
  doctor    the same as health
  policy    check, show or list policy files

Run 'rlm-sandbox COMMAND --help' (or 'rlm-sandbox help COMMAND') for a command's options and
examples; 'rlm-sandbox --version' prints the version.

examples:
  rlm-sandbox run -- python3 -c 'print(6 * 7)'
  rlm-sandbox run --policy strict --bind-ro "$PWD:/work" -w /work --timeout 2s --json ./untrusted
  rlm-sandbox repl --context prompt.txt --lm echo
  rlm-sandbox policy check my-policy.json
  rlm-sandbox health
  rlm-sandbox serve --socket /tmp/rlm.sock --pool default=4 &
  rlm-sandbox run --server /tmp/rlm.sock -- /bin/true
  rlm-sandbox server status --server /tmp/rlm.sock
)";

// The static CLI has no HTTP client; its dynamically linked sibling does the same command.
int run_full_sibling([[maybe_unused]] char** argv, const rlm::NeedsFullBinary& why) {
#ifdef RLM_CLI_FULL_SIBLING
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto sibling = (self.parent_path() / RLM_CLI_FULL_SIBLING).string();
  if (!ec) execv(sibling.c_str(), argv);
  rlm::cli::print_error(std::string(why.what()) + "; and " + sibling +
                        " (the build with libcurl) cannot be executed");
#else
  rlm::cli::print_error(why.what());
#endif
  return rlm::cli::kExitSetup;
}

int main_of(const std::vector<std::string>& words, char** argv);

// `help COMMAND` is `COMMAND --help`.
int run_help_of(const std::string& command, char** argv) {
  return main_of({command, "--help"}, argv);
}

int main_of(const std::vector<std::string>& words, char** argv) {
  if (words.empty()) {
    std::cerr << kOverview;
    return rlm::cli::kExitUsage;
  }
  const std::string command = words.front();
  const std::vector<std::string> rest(words.begin() + 1, words.end());
  try {
    if (command == "run") return rlm::cli::run_command(rest);
    if (command == "repl") return rlm::cli::repl_command(rest);
    if (command == "serve") return rlm::cli::serve_command(rest);
    if (command == "server") return rlm::cli::server_command(rest);
    if (command == "fleet") return rlm::cli::fleet_command(rest);
    if (command == "health" || command == "doctor") return rlm::cli::health_command(rest);
    if (command == "policy") return rlm::cli::policy_command(rest);
    if (command == "help" && rest.size() == 1 && rest.front() != "help")
      return run_help_of(rest.front(), argv);
    if (command == "--help" || command == "-h" || command == "help") {
      std::cout << kOverview;
      return 0;
    }
    if (command == "--version") {
      std::cout << "rlm-sandbox " << RLM_SANDBOX_VERSION << "\n";
      return 0;
    }
    throw rlm::cli::UsageError("unknown command '" + command + "'", "");
  } catch (const rlm::NeedsFullBinary& e) {
    return run_full_sibling(argv, e);
  } catch (const rlm::cli::BadFlagValue& e) {
    rlm::cli::print_error(std::string(e.what()) + " (see 'rlm-sandbox " + command + " --help')");
    return rlm::cli::kExitUsage;
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
}  // namespace

int main(int argc, char** argv) {
  return main_of(std::vector<std::string>(argv + 1, argv + argc), argv);
}
