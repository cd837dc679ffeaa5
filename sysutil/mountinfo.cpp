// current_mountinfo (sys.hpp): the process's mount table, read again only when it changed.
//
// A run reads the table several times (policy checks of bind sources, the host's mount flags,
// cgroup mounts, setup signals), each read ~40 us of kernel formatting on a small VM, and a server
// reads it for every sandbox it builds. The kernel says when the table changed: an open
// /proc/self/mountinfo polls POLLPRI after any mount or unmount in its namespace since the last
// poll. So one fd is kept, polled first (which also re-arms it), and the text re-read only then.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "rlm_sys/sys.hpp"

namespace rlm::sys {
namespace {

constexpr std::size_t kMaxMountinfoBytes = std::size_t{4} << 20;

// The whole file from its start, or nullopt when unreadable or over the bound.
std::optional<std::string> read_from_start(int fd) {
  if (lseek(fd, 0, SEEK_SET) != 0) return std::nullopt;
  std::string text;
  char chunk[8192];
  for (;;) {
    const ssize_t got = read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::nullopt;
    if (got == 0) return text;
    text.append(chunk, static_cast<std::size_t>(got));
    if (text.size() > kMaxMountinfoBytes) return std::nullopt;
  }
}

struct Cache {
  std::mutex mutex;
  int fd = -1;
  pid_t owner = 0;      // the process that opened fd: a forked child shares its offset, so reopens
  ino_t namespace_ = 0; // the mount namespace fd shows
  std::optional<std::string> text;
};

ino_t mount_namespace() {
  struct stat status {};
  return stat("/proc/thread-self/ns/mnt", &status) == 0 ? status.st_ino : 0;
}

}  // namespace

std::optional<std::string> current_mountinfo() {
  static Cache cache;
  std::lock_guard lock(cache.mutex);
  const pid_t self = getpid();
  const ino_t space = mount_namespace();
  if (cache.fd >= 0 && (cache.owner != self || cache.namespace_ != space || space == 0)) {
    if (cache.owner == self) close(cache.fd);  // a fork's inherited copy is left to the parent
    cache.fd = -1;
    cache.text.reset();
  }
  if (cache.fd < 0) {
    cache.fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (cache.fd < 0) return std::nullopt;
    cache.owner = self;
    cache.namespace_ = space;
  }
  pollfd changed{cache.fd, POLLPRI, 0};
  int ready;
  while ((ready = poll(&changed, 1, 0)) < 0 && errno == EINTR) {
  }
  if (ready != 0 || !cache.text) cache.text = read_from_start(cache.fd);
  return cache.text;
}

}  // namespace rlm::sys
