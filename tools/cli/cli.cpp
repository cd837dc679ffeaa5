#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/units.hpp"

namespace po = boost::program_options;

namespace rlm::cli {

po::variables_map parse_options(const std::vector<std::string>& args,
                                const po::options_description& options, const std::string& command,
                                const char* positional_name) {
  po::variables_map values;
  try {
    po::positional_options_description positional;
    if (positional_name) positional.add(positional_name, -1);
    po::store(
        po::command_line_parser(args)
            .options(options)
            .positional(positional)
            .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
            .run(),
        values);
    po::notify(values);
  } catch (const po::error& e) {
    throw UsageError(e.what(), command);
  }
  return values;
}

std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& text) {
  auto value = parse_duration(text);
  if (!value || value->count() <= 0)
    throw Error(flag + " '" + text +
                "': not a duration; use milliseconds or a number with ms, s, m or h (e.g. 10s)");
  return *value;
}

std::uint64_t size_flag(const std::string& flag, const std::string& text) {
  auto value = parse_size(text);
  if (!value || *value == 0)
    throw Error(flag + " '" + text +
                "': not a size; use bytes or a number with K, M, G or T (e.g. 256M)");
  return *value;
}

std::uint32_t count_flag(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  unsigned long value = 0;
  try {
    value = std::stoul(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-' || value == 0 || value > 1'000'000)
    throw Error(flag + " '" + text + "': expected a whole number from 1 to 1000000");
  return static_cast<std::uint32_t>(value);
}

double cpus_flag(const std::string& flag, const std::string& text) {
  // Digits and at most one point: no exponents, signs, "inf" or "nan".
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos &&
                     std::count(text.begin(), text.end(), '.') <= 1 && text != ".";
  const double value = plain ? std::strtod(text.c_str(), nullptr) : 0;
  if (!(value >= kMinCpus && value <= kMaxCpus))
    throw Error(flag + " '" + text + "': expected a number of CPUs from " + format_cpus(kMinCpus) +
                " to " + format_cpus(kMaxCpus) + " (e.g. 0.5 or 2)");
  return value;
}

void print_error(const std::string& message) {
  std::cerr << "rlm-sandbox: " << message << "\n";
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace rlm::cli
