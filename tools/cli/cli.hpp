// What the subcommands of the rlm-sandbox CLI share: the exit-status contract and error kinds.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace rlm::cli {

// DESIGN.md §8: these exit statuses are a contract with scripts; never change them silently.
inline constexpr int kExitUsage = 2;          // unknown flag, missing argument
inline constexpr int kExitPolicyInvalid = 1;  // `policy check` found problems
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitSetup = 125;  // the sandbox could not be set up; stderr says why

// A mistake in how the command was called: printed with a pointer to --help, exit 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string command)
      : std::runtime_error(message), command(std::move(command)) {}
  std::string command;  // "run", "policy check", ... for the --help pointer
};

// Subcommands: `args` are the words after the subcommand's name.
int run_command(const std::vector<std::string>& args);
int health_command(const std::vector<std::string>& args);
int policy_command(const std::vector<std::string>& args);
int repl_command(const std::vector<std::string>& args);

// Flag values, checked with a message naming the flag (throw Error).
std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& text);
std::uint64_t size_flag(const std::string& flag, const std::string& text);
std::uint32_t count_flag(const std::string& flag, const std::string& text);
double cpus_flag(const std::string& flag, const std::string& text);  // "0.5", "2"

// Parses `args` against `options` (plus positional words, collected into "args" when
// `positional_name` is set); Boost's errors become UsageError for `command`.
boost::program_options::variables_map parse_options(
    const std::vector<std::string>& args,
    const boost::program_options::options_description& options, const std::string& command,
    const char* positional_name = nullptr);

// Prints "rlm-sandbox: MESSAGE" on stderr.
void print_error(const std::string& message);

// Writes all of `data` to `fd`, retrying short writes; false on error (e.g. EPIPE).
bool write_all(int fd, std::string_view data);

}  // namespace rlm::cli
