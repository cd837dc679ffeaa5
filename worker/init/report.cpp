#include "report.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "rlm_init/protocol.hpp"

namespace rlm::init {
namespace {

namespace protocol = rlm::init_protocol;

// A JSON string literal. Bytes outside ASCII are escaped one by one (\u00XX) so the line is valid
// JSON whatever argv[0] holds; the runtime uses its own copy of such strings for messages.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string field(const char* key, long long value) {
  return quoted(key) + ":" + std::to_string(value);
}

std::string field(const char* key, const std::string& value) {
  return quoted(key) + ":" + quoted(value);
}

constexpr std::size_t kReportPathBytes = 512;

}  // namespace

std::string format_report(const Outcome& outcome) {
  // The path (argv[0], a directory) is for messages only, and the runtime words an exec failure
  // from its own copy of argv[0]: at most 512 bytes of it keep the line (each byte outside ASCII
  // becomes six) well under what the runtime keeps of a report, whatever the path.
  const std::string path = outcome.path.substr(0, kReportPathBytes);
  std::string body;
  switch (outcome.kind) {
    case Outcome::Kind::exited:
    case Outcome::Kind::signaled: {
      const bool exited = outcome.kind == Outcome::Kind::exited;
      body = field(exited ? protocol::kExitCodeKey : protocol::kSignalKey, outcome.value) + "," +
             field(protocol::kCpuKey, outcome.cpu_us);
      break;
    }
    case Outcome::Kind::exec_failed:
      body = field(protocol::kExecErrnoKey, outcome.value) + "," + field(protocol::kPathKey, path);
      break;
    case Outcome::Kind::setup_failed:
      body = field(protocol::kSetupErrnoKey, outcome.value) + "," +
             field(protocol::kStepKey, outcome.step) + "," + field(protocol::kPathKey, path);
      break;
    case Outcome::Kind::init_failed:
      body = field(protocol::kInitErrorKey, outcome.message);
      break;
  }
  if (outcome.seccomp_syscall >= 0)
    body += "," + field(protocol::kSeccompViolationKey, outcome.seccomp_syscall);
  if (outcome.terminated) body += "," + quoted(protocol::kTerminatedKey) + ":true";
  if (outcome.terminated_by_payload)
    body += "," + quoted(protocol::kTerminatedByPayloadKey) + ":true";
  return "{" + body + "}\n";
}

void write_report(int fd, const Outcome& outcome) {
  if (fd < 0) return;
  const std::string line = format_report(outcome);
  while (write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
  }
}

int mirrored_exit_status(const Outcome& outcome) {
  switch (outcome.kind) {
    case Outcome::Kind::exited:
      return outcome.value;
    case Outcome::Kind::signaled:
      return 128 + outcome.value;
    case Outcome::Kind::exec_failed:
      return outcome.value == ENOENT ? 127 : 126;
    default:
      return protocol::kInitFailureExit;
  }
}

}  // namespace rlm::init
