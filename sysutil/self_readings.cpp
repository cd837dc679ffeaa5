#include "rlm_sys/self_readings.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rlm::sys {
namespace {

constexpr std::size_t kMaxBytes = std::size_t{16} << 20;

thread_local SelfReadingScope* current_scope = nullptr;

std::optional<std::string> read_whole(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char chunk[8192];
  while (text.size() < kMaxBytes) {
    const ssize_t got = read(fd, chunk, std::min(sizeof chunk, kMaxBytes - text.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      close(fd);
      errno = error;
      return std::nullopt;
    }
    if (got == 0) break;
    text.append(chunk, static_cast<std::size_t>(got));
  }
  close(fd);
  return text;
}

}  // namespace

struct SelfReadings {
  static std::optional<std::string> read(std::optional<std::string> SelfReadingScope::*slot,
                                         const char* path) {
    SelfReadingScope* scope = current_scope;
    if (scope && scope->*slot) return scope->*slot;
    auto text = read_whole(path);
    if (scope && text) scope->*slot = text;
    return text;
  }
  static std::optional<std::string> mountinfo() {
    return read(&SelfReadingScope::mountinfo_, "/proc/self/mountinfo");
  }
  static std::optional<std::string> cgroup() {
    return read(&SelfReadingScope::cgroup_, "/proc/self/cgroup");
  }
};

SelfReadingScope::SelfReadingScope() noexcept {
  if (current_scope) return;
  current_scope = this;
  active_ = true;
}

SelfReadingScope::~SelfReadingScope() {
  if (active_) current_scope = nullptr;
}

std::optional<std::string> self_mountinfo() {
  return SelfReadings::mountinfo();
}

std::optional<std::string> self_cgroup() {
  return SelfReadings::cgroup();
}

}  // namespace rlm::sys
