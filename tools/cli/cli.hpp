// What the subcommands of the rlm-sandbox CLI share: the exit-status contract (exit_status.hpp),
// error kinds and flag parsing.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "exit_status.hpp"

namespace rlm::cli {

// A mistake in how the command was called: printed with a pointer to --help, exit 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string command)
      : std::runtime_error(message), command(std::move(command)) {}
  std::string command;  // "run", "policy check", ... for the --help pointer
};

// A flag's value that cannot mean anything ("--memory 12X"): a usage error, exit 2; the --help
// pointer names the subcommand being run.
class BadFlagValue : public UsageError {
 public:
  explicit BadFlagValue(const std::string& message) : UsageError(message, "") {}
};

// Subcommands: `args` are the words after the subcommand's name.
int run_command(const std::vector<std::string>& args);
int health_command(const std::vector<std::string>& args);
int policy_command(const std::vector<std::string>& args);
int repl_command(const std::vector<std::string>& args);
int serve_command(const std::vector<std::string>& args);
int server_command(const std::vector<std::string>& args);
int fleet_command(const std::vector<std::string>& args);

// Flag values, checked with a message naming the flag (throw BadFlagValue). A bare number is
// seconds for a duration (as timeout(1) and nsjail read it); a size must name its unit.
std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& text);
std::uint64_t size_flag(const std::string& flag, const std::string& text);
std::uint32_t count_flag(const std::string& flag, const std::string& text);
double cpus_flag(const std::string& flag, const std::string& text);  // "0.5", "2"

// Parses `args` against `options` (plus positional words, collected into "args" when
// `positional_name` is set); Boost's errors become UsageError for `command`. `in_order`, when
// given, receives the options as they were written (for flags whose order matters: mounts).
boost::program_options::variables_map parse_options(
    const std::vector<std::string>& args,
    const boost::program_options::options_description& options, const std::string& command,
    const char* positional_name = nullptr,
    std::vector<boost::program_options::option>* in_order = nullptr);

// The words of a command that runs a command: its options end at "--" or at the first word that
// is neither an option nor an option's value (docker's, bwrap's and nsjail's rule), and the
// payload's argv is the rest, untouched: `run ls -la /` runs `ls -la /`.
struct CommandLine {
  std::vector<std::string> options, payload;
};
CommandLine split_at_command(const std::vector<std::string>& args,
                             const boost::program_options::options_description& options);

// Prints "rlm-sandbox: MESSAGE" on stderr.
void print_error(const std::string& message);

// Writes all of `data` to `fd`, retrying short writes; false on error (e.g. EPIPE).
bool write_all(int fd, std::string_view data);

}  // namespace rlm::cli
