// Small system utilities the library, rlm-sandbox-init and the tools share: one copy of each.
// No allocation in the fd-passing calls, so they are usable between fork and exec.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::sys {

// strerror as a std::string, thread-safe.
std::string errno_text(int error);

// The poll(2) timeout that waits until `deadline` and not a millisecond less (rounded up, never
// negative, bounded so it fits an int).
int poll_timeout_ms(std::chrono::steady_clock::time_point deadline);

// `items` with `separator` between them.
std::string join(std::span<const std::string> items, std::string_view separator);

// The first `max_bytes` of a (typically /proc) file, or "" when it cannot be read.
std::string read_text_file(const char* path, std::size_t max_bytes = std::size_t{4} << 20);

// One line of /proc/<pid>/mountinfo, its paths unescaped.
struct MountInfo {
  std::string root;         // the mounted tree's root inside its filesystem
  std::string mount_point;  // where it is mounted
  std::string options;      // per-mount options ("rw,nosuid,...")
  std::string fs_type;
  std::string source;
  std::string super_options;  // per-superblock options
};

// Every well-formed line of `text` (malformed lines are skipped).
std::vector<MountInfo> parse_mountinfo(std::string_view text);

// Undoes mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134 backslash).
std::string unescape_mountinfo(std::string_view field);

// write() that cannot raise SIGPIPE in this process, whatever its disposition of SIGPIPE: for a
// peer (a payload's stdin, an orchestrator) that may stop reading. -1 with errno EPIPE then.
long write_without_sigpipe(int fd, const char* data, std::size_t size);

// One sendmsg(2) of `data` with `fds` attached (SCM_RIGHTS; at most kMaxSentFds, more is EINVAL),
// `flags` added to MSG_NOSIGNAL, EINTR retried: the bytes sent, or -1 with errno set.
// Async-signal-safe.
inline constexpr std::size_t kMaxSentFds = 16;
long send_with_fds(int socket, std::string_view data, std::span<const int> fds,
                   int flags = 0) noexcept;

// Sends one byte carrying `fd` over a unix socket. 0, or the errno. Async-signal-safe.
int send_fd(int socket, int fd) noexcept;

// What one recvmsg(2) with room for `fds.size()` descriptors brought.
struct Received {
  long bytes = -1;      // as recvmsg returns it (-1 with `error` set)
  int error = 0;        // errno of a failed recvmsg (EINTR is retried)
  std::size_t fds = 0;  // descriptors stored at the front of the caller's span (close-on-exec)
  bool truncated =
      false;  // more descriptors were sent than there was room for (the kernel closed them)
};

// Receives into `data` and up to `fds.size()` descriptors; `flags` are added to MSG_CMSG_CLOEXEC.
// Descriptors beyond the room are closed by the kernel and reported as `truncated`.
Received receive_with_fds(int socket, std::span<char> data, std::span<int> fds,
                          int flags = 0) noexcept;

}  // namespace rlm::sys
