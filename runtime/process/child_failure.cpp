#include "process/child_failure.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace rlm::process {

void ChildFailure::set(const char* name, int errno_value) noexcept {
  std::size_t length = 0;
  if (name)
    for (; name[length] != '\0' && length + 1 < kStepCapacity; ++length)
      step[length] = name[length];
  step[length] = '\0';
  error = errno_value;
}

void exit_with_failure(int fd, const ChildFailure& failure, int exit_code) noexcept {
  while (write(fd, &failure, sizeof failure) < 0 && errno == EINTR) {
  }
  _exit(exit_code);
}

ChildReport read_child_report(int fd, int timeout_ms) noexcept {
  ChildReport report;
  pollfd child{fd, POLLIN, 0};
  int ready;
  while ((ready = poll(&child, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (ready == 0) {
    report.kind = ChildReport::Kind::timed_out;
    return report;
  }
  if (ready < 0) {
    report.kind = ChildReport::Kind::unreadable;
    report.failure.error = errno;
    return report;
  }
  ssize_t got;
  while ((got = read(fd, &report.failure, sizeof report.failure)) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof report.failure)) {
    report.kind = ChildReport::Kind::failed;
  } else if (got != 0) {
    const int error = got < 0 ? errno : EIO;
    report.failure = {};
    report.failure.error = error;
    report.kind = ChildReport::Kind::unreadable;
  }
  return report;
}

}  // namespace rlm::process
