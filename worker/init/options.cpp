#include "options.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "rlm_init/protocol.hpp"

namespace rlm::init {
namespace {

struct NamedResource {
  const char* name;
  int resource;
};

constexpr NamedResource kResources[] = {
    {"cpu", RLIMIT_CPU},       {"as", RLIMIT_AS},       {"fsize", RLIMIT_FSIZE},
    {"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE},   {"nproc", RLIMIT_NPROC},
    {"data", RLIMIT_DATA},     {"stack", RLIMIT_STACK},
};

bool parse_number(std::string_view text, unsigned long long& value) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return false;
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  value = std::strtoull(copy.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

bool parse_limit_value(std::string_view text, rlim_t& value) {
  if (text == "unlimited") {
    value = RLIM_INFINITY;
    return true;
  }
  unsigned long long number = 0;
  if (!parse_number(text, number) || number >= RLIM_INFINITY) return false;
  value = static_cast<rlim_t>(number);
  return true;
}

}  // namespace

// "NAME=SOFT:HARD" or "NAME=VALUE" (soft and hard alike).
std::string parse_rlimit(std::string_view text, ResourceLimit& limit) {
  const auto equals = text.find('=');
  if (equals == std::string_view::npos)
    return "--rlimit " + std::string(text) + ": expected NAME=SOFT:HARD";
  const auto name = text.substr(0, equals);
  const NamedResource* found = nullptr;
  for (const auto& candidate : kResources)
    if (name == candidate.name) found = &candidate;
  if (!found)
    return "--rlimit " + std::string(text) +
           ": unknown resource; use cpu, as, fsize, nofile, core, nproc, data or stack";
  auto values = text.substr(equals + 1);
  const auto colon = values.find(':');
  const auto soft = values.substr(0, colon);
  const auto hard = colon == std::string_view::npos ? soft : values.substr(colon + 1);
  limit = {found->name, found->resource, 0, 0};
  if (!parse_limit_value(soft, limit.soft) || !parse_limit_value(hard, limit.hard) ||
      limit.soft > limit.hard)
    return "--rlimit " + std::string(text) + ": expected numbers or 'unlimited' with SOFT <= HARD";
  return "";
}

std::string parse_options(int argc, char** argv, Options& options) {
  namespace protocol = rlm::init_protocol;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--") {
      ++i;
      break;
    }
    if (flag == protocol::kPid1Flag) {
      options.pid1 = true;
      continue;
    }
    if (flag == protocol::kGuardSignalsFlag) {
      options.guard_signals = true;
      continue;
    }
    if (flag == protocol::kHoldAfterReportFlag) {
      options.hold_after_report = true;
      continue;
    }
    const bool known = flag == protocol::kReportFdFlag || flag == protocol::kGraceFlag ||
                       flag == protocol::kRlimitFlag || flag == protocol::kChdirFlag ||
                       flag == protocol::kSeccompFdFlag || flag == protocol::kSeccompNotifyFdFlag ||
                       flag == protocol::kAwaitPayloadFlag;
    if (!known) return std::string(flag) + ": unknown flag";
    if (i + 1 >= argc) return std::string(flag) + ": missing value";
    const std::string_view value = argv[i + 1];
    unsigned long long number = 0;
    if (flag == protocol::kReportFdFlag) {
      if (!parse_number(value, number) || number > 1'000'000)
        return "--report-fd " + std::string(value) + ": expected a file descriptor number";
      options.report_fd = static_cast<int>(number);
    } else if (flag == protocol::kAwaitPayloadFlag) {
      if (!parse_number(value, number) || number > 1'000'000)
        return std::string(flag) + " " + std::string(value) + ": expected a file descriptor number";
      options.await_fd = static_cast<int>(number);
    } else if (flag == protocol::kSeccompFdFlag || flag == protocol::kSeccompNotifyFdFlag) {
      if (!parse_number(value, number) || number > 1'000'000)
        return std::string(flag) + " " + std::string(value) + ": expected a file descriptor number";
      (flag == protocol::kSeccompFdFlag ? options.seccomp_fd : options.seccomp_notify_fd) =
          static_cast<int>(number);
    } else if (flag == protocol::kGraceFlag) {
      if (!parse_number(value, number) || number > 3'600'000)
        return "--grace-ms " + std::string(value) + ": expected milliseconds up to one hour";
      options.grace_ms = static_cast<int>(number);
    } else if (flag == protocol::kRlimitFlag) {
      ResourceLimit limit{};
      if (auto error = parse_rlimit(value, limit); !error.empty()) return error;
      options.limits.push_back(limit);
    } else {
      options.workdir = argv[i + 1];
    }
    ++i;
  }
  if (options.await_fd >= 0) {
    // The message says what to run, in which directory, under which limits.
    if (i < argc || options.workdir || !options.limits.empty() || options.guard_signals)
      return std::string(protocol::kAwaitPayloadFlag) +
             " takes the command, --chdir, --rlimit and --guard-signals from its message";
    if (options.seccomp_notify_fd >= 0 && options.seccomp_fd < 0)
      return std::string(protocol::kSeccompNotifyFdFlag) + " needs " + protocol::kSeccompFdFlag +
             " (the program to fall back to)";
    return "";
  }
  if (options.hold_after_report)
    return std::string(protocol::kHoldAfterReportFlag) + " needs " + protocol::kAwaitPayloadFlag;
  if (i >= argc) return "no command given after '--'";
  if (options.seccomp_notify_fd >= 0 && options.seccomp_fd < 0)
    return std::string(protocol::kSeccompNotifyFdFlag) + " needs " + protocol::kSeccompFdFlag +
           " (the program to fall back to)";
  if (options.guard_signals && options.seccomp_fd < 0)
    return std::string(protocol::kGuardSignalsFlag) + " needs " + protocol::kSeccompFdFlag +
           " (the program to add the guard to)";
  options.payload_argv = argv + i;
  return "";
}

}  // namespace rlm::init
