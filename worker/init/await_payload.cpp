#include "await_payload.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "rlm_init/protocol.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::init {
namespace {

namespace protocol = rlm::init_protocol;

// Header words, in their order on the wire.
enum Word { kMagic, kBodyBytes, kArgc, kEnvc, kLimits, kInherited, kFlags, kGraceMs };
constexpr std::size_t kMaxFds = 3 + protocol::kPayloadMaxInherited;

// Blocks until `socket` is readable. False when a SIGTERM arrived first (other signals are
// drained: nothing to forward yet).
bool wait_readable(int socket, int signal_fd) {
  for (;;) {
    pollfd watched[2] = {{socket, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    if (poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (watched[1].revents & POLLIN) {
      signalfd_siginfo info{};
      while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
        if (info.ssi_signo == SIGTERM) return false;
    }
    if (watched[0].revents) return true;
  }
}

// Reads exactly `data.size()` bytes. Fds may come only with the message's first byte (`first`).
std::string read_exactly(int socket, int signal_fd, std::span<char> data, bool first,
                         std::vector<int>& fds) {
  std::size_t done = 0;
  while (done < data.size()) {
    if (!wait_readable(socket, signal_fd)) return "SIGTERM while waiting for the payload";
    int received[kMaxFds + 1];
    const auto got = sys::receive_with_fds(socket, data.subspan(done), received, MSG_DONTWAIT);
    for (std::size_t i = 0; i < got.fds; ++i) fds.push_back(received[i]);
    if (got.bytes < 0) {
      if (got.error == EAGAIN) continue;
      return std::string("reading the payload message: ") + std::strerror(got.error);
    }
    if (got.truncated || (got.fds && !(first && done == 0)))
      return "the payload message carries more or misplaced descriptors";
    if (got.bytes == 0)
      return done == 0 && first ? "the host closed the socket before sending a payload"
                                : "the payload message ends early";
    done += static_cast<std::size_t>(got.bytes);
  }
  return "";
}

std::uint32_t word(const char* header, int index) {
  std::uint32_t value;
  std::memcpy(&value, header + index * 4, 4);
  return value;  // little-endian hosts only (x86-64, aarch64): the host is this machine
}

bool parse_fd_number(const char* text, int& fd) {
  if (*text < '0' || *text > '9') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long value = std::strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < 4 || value > 1'000'000) return false;
  fd = static_cast<int>(value);
  return true;
}

}  // namespace

AwaitedPayload::~AwaitedPayload() {
  for (int fd : fds)
    if (fd >= 0) close(fd);
}

std::string await_payload(int socket, int signal_fd, Options& options, AwaitedPayload& payload) {
  char header[protocol::kPayloadHeaderWords * 4];
  if (auto error = read_exactly(socket, signal_fd, header, true, payload.fds); !error.empty())
    return error;
  const std::uint32_t body_bytes = word(header, kBodyBytes), argc = word(header, kArgc),
                      envc = word(header, kEnvc), limits = word(header, kLimits),
                      inherited = word(header, kInherited), flags = word(header, kFlags),
                      grace = word(header, kGraceMs);
  if (word(header, kMagic) != protocol::kPayloadMagic) return "not a payload message (magic)";
  if (body_bytes == 0 || body_bytes > protocol::kPayloadMaxBodyBytes)
    return "payload message: body size out of range";
  if (argc == 0 || argc > protocol::kPayloadMaxStrings || envc > protocol::kPayloadMaxStrings ||
      limits > protocol::kPayloadMaxLimits || inherited > protocol::kPayloadMaxInherited)
    return "payload message: a count is out of range";
  if ((flags & ~(protocol::kPayloadGuardSignals | protocol::kPayloadStdio)) != 0)
    return "payload message: unknown flags";
  if (grace > protocol::kPayloadMaxGraceMs) return "payload message: grace out of range";
  const std::size_t stdio = (flags & protocol::kPayloadStdio) ? 3 : 0;
  if (payload.fds.size() != stdio + inherited)
    return "payload message: " + std::to_string(payload.fds.size()) + " descriptors, expected " +
           std::to_string(stdio + inherited);

  payload.body.resize(body_bytes);
  if (auto error = read_exactly(socket, signal_fd, payload.body, false, payload.fds);
      !error.empty())
    return error;
  if (payload.body.back() != '\0') return "payload message: the body does not end in NUL";

  // Split the body at its NULs: exactly the strings the header announced.
  const std::size_t expected = 1 + std::size_t{limits} + inherited + argc + envc;
  std::vector<char*> strings;
  strings.reserve(expected);
  for (std::size_t at = 0; at < payload.body.size();) {
    if (strings.size() == expected) return "payload message: more strings than announced";
    char* text = payload.body.data() + at;
    strings.push_back(text);
    at += std::strlen(text) + 1;
  }
  if (strings.size() != expected) return "payload message: fewer strings than announced";

  std::size_t next = 0;
  options.workdir = *strings[next] ? strings[next] : nullptr;
  ++next;
  options.limits.clear();
  for (std::uint32_t i = 0; i < limits; ++i) {
    ResourceLimit limit{};
    if (auto error = parse_rlimit(strings[next++], limit); !error.empty())
      return "payload message: " + error;
    options.limits.push_back(limit);
  }
  options.inherited_count = static_cast<int>(inherited);
  for (std::uint32_t i = 0; i < inherited; ++i) {
    int target = -1;
    if (!parse_fd_number(strings[next++], target))
      return "payload message: an inherited fd number is not a number >= 4";
    for (std::uint32_t j = 0; j < i; ++j)
      if (options.inherited_targets[j] == target)
        return "payload message: an inherited fd number is listed twice";
    options.inherited_targets[i] = target;
    options.inherited_fds[i] = payload.fds[stdio + i];
  }
  payload.argv.assign(strings.begin() + next, strings.begin() + next + argc);
  payload.argv.push_back(nullptr);
  next += argc;
  for (std::uint32_t i = 0; i < envc; ++i) {
    const char* entry = strings[next + i];
    const char* equals = std::strchr(entry, '=');
    if (!equals || equals == entry)
      return "payload message: an environment entry is not NAME=value";
  }
  payload.envp.assign(strings.begin() + next, strings.begin() + next + envc);
  payload.envp.push_back(nullptr);

  options.payload_argv = payload.argv.data();
  options.payload_envp = payload.envp.data();
  options.guard_signals = (flags & protocol::kPayloadGuardSignals) != 0;
  options.grace_ms = static_cast<int>(grace);
  for (std::size_t i = 0; i < stdio; ++i) options.payload_stdio[i] = payload.fds[i];
  return "";
}

void hold_until_host_leaves(int socket, int signal_fd) {
  for (;;) {
    pollfd watched[2] = {{socket, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    if (poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (watched[1].revents & POLLIN) {
      signalfd_siginfo info{};
      while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
        if (info.ssi_signo != SIGCHLD) return;
    }
    if (watched[0].revents) {
      char discard[256];
      const ssize_t count = recv(socket, discard, sizeof discard, MSG_DONTWAIT);
      if (count == 0 || (count < 0 && errno != EAGAIN && errno != EINTR)) return;
    }
  }
}

}  // namespace rlm::init
