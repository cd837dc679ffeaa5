#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/units.hpp"

namespace po = boost::program_options;

namespace rlm::cli {

po::variables_map parse_options(const std::vector<std::string>& args,
                                const po::options_description& options, const std::string& command,
                                const char* positional_name, std::vector<po::option>* in_order) {
  po::variables_map values;
  try {
    po::positional_options_description positional;
    if (positional_name) positional.add(positional_name, -1);
    auto parsed =
        po::command_line_parser(args)
            .options(options)
            .positional(positional)
            .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
            .run();
    po::store(parsed, values);
    po::notify(values);
    if (in_order) *in_order = std::move(parsed.options);
  } catch (const po::error& e) {
    throw UsageError(e.what(), command);
  }
  return values;
}

namespace {

// Whether the option a word names takes a value as the next word. Unknown options take none:
// the parser refuses them by name later.
bool takes_next_word(const std::string& word, const po::options_description& options) {
  if (word.rfind("--", 0) == 0) {
    if (word.find('=') != std::string::npos) return false;  // --name=value
    const auto* option = options.find_nothrow(word.substr(2), false);
    return option && option->semantic()->max_tokens() > 0;
  }
  if (word.size() != 2) return false;                      // -tVALUE, or several short switches
  const auto* option = options.find_nothrow(word, false);  // short names are kept with their dash
  return option && option->semantic()->max_tokens() > 0;
}

}  // namespace

CommandLine split_at_command(const std::vector<std::string>& args,
                             const po::options_description& options) {
  CommandLine line;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") {
      line.payload.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      return line;
    }
    if (word.size() < 2 || word.front() != '-') {  // "-" alone is an argument, as in cat -
      line.payload.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      return line;
    }
    line.options.push_back(word);
    if (takes_next_word(word, options) && i + 1 < args.size()) line.options.push_back(args[++i]);
  }
  return line;
}

namespace {

bool all_digits(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& text) {
  constexpr std::size_t kMaxSecondsDigits = 9;  // ~31 years: no overflow in milliseconds
  std::optional<std::chrono::milliseconds> value;
  if (all_digits(text))
    value = text.size() <= kMaxSecondsDigits
                ? std::optional(std::chrono::milliseconds(std::stoull(text) * 1000))
                : std::nullopt;
  else
    value = parse_duration(text);
  if (!value || value->count() <= 0)
    throw BadFlagValue(flag + " '" + text +
                       "': not a duration; use seconds (30) or a number with ms, s, m or h "
                       "(500ms, 1.5s, 2m)");
  return *value;
}

std::uint64_t size_flag(const std::string& flag, const std::string& text) {
  if (all_digits(text))
    throw BadFlagValue(flag + " '" + text + "': a size needs its unit: " + text + "M, " + text +
                       "K, or " + text + "B for bytes (K, M, G and T are powers of 1024)");
  auto value = parse_size(text);
  if (!value || *value == 0)
    throw BadFlagValue(flag + " '" + text +
                       "': not a size; use a number with B, K, M, G or T (e.g. 256M)");
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
    throw BadFlagValue(flag + " '" + text + "': expected a whole number from 1 to 1000000");
  return static_cast<std::uint32_t>(value);
}

double cpus_flag(const std::string& flag, const std::string& text) {
  // Digits and at most one point: no exponents, signs, "inf" or "nan".
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos &&
                     std::count(text.begin(), text.end(), '.') <= 1 && text != ".";
  const double value = plain ? std::strtod(text.c_str(), nullptr) : 0;
  if (!(value >= kMinCpus && value <= kMaxCpus))
    throw BadFlagValue(flag + " '" + text + "': expected a number of CPUs from " +
                       format_cpus(kMinCpus) + " to " + format_cpus(kMaxCpus) + " (e.g. 0.5 or 2)");
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
