#include "common/fd_inherit.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace rlm::common {
namespace {

void close_span(unsigned first, unsigned last, unsigned ceiling) noexcept {
  if (first > last) return;
  if (syscall(SYS_close_range, first, last, 0) == 0) return;
  for (unsigned fd = first; fd <= last && fd < ceiling; ++fd) close(static_cast<int>(fd));
}

}  // namespace

void close_fds_except(unsigned first, KeptFds keep, unsigned ceiling) noexcept {
  std::sort(keep.begin(), keep.end());  // in place on a copy: no allocation
  unsigned next = first;
  for (const int fd : keep) {
    if (fd < 0 || static_cast<unsigned>(fd) < next) continue;
    close_span(next, static_cast<unsigned>(fd) - 1, ceiling);
    next = static_cast<unsigned>(fd) + 1;
  }
  close_span(next, ~0u, ceiling);
}

bool clear_cloexec(const KeptFds& keep) noexcept {
  for (const int fd : keep)
    if (fd >= 0 && fcntl(fd, F_SETFD, 0) != 0) return false;
  return true;
}

}  // namespace rlm::common
