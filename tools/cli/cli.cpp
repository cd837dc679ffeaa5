#include "cli.hpp"

#include <unistd.h>

#include <cerrno>
#include <iostream>

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
