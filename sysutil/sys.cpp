#include "rlm_sys/sys.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace rlm::sys {

std::string read_text_file(const char* path, std::size_t max_bytes) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char chunk[8192];
  while (text.size() < max_bytes) {
    const ssize_t got = read(fd, chunk, std::min(sizeof chunk, max_bytes - text.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(chunk, static_cast<std::size_t>(got));
  }
  close(fd);
  return text;
}

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly a static string, not the buffer).
  return ::strerror_r(error, buffer, sizeof buffer);
}

int poll_timeout_ms(std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  const auto left =
      std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count() + 1, 0, 1'000'000'000));
}

std::string join(std::span<const std::string> items, std::string_view separator) {
  std::string text;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) text += separator;
    text += items[i];
  }
  return text;
}

namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  for (;;) {
    const std::size_t end = text.find(separator);
    fields.push_back(text.substr(0, end));
    if (end == std::string_view::npos) return fields;
    text.remove_prefix(end + 1);
  }
}

}  // namespace

std::string unescape_mountinfo(std::string_view field) {
  const auto octal = [&](std::size_t at) { return field[at] >= '0' && field[at] <= '7'; };
  std::string text;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      text += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                (field[i + 3] - '0'));
      i += 3;
      continue;
    }
    text += field[i];
  }
  return text;
}

std::vector<MountInfo> parse_mountinfo(std::string_view text) {
  std::vector<MountInfo> mounts;
  for (std::string_view line : split(text, '\n')) {
    // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS
    const auto fields = split(line, ' ');
    std::size_t dash = 0;
    for (std::size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 3 >= fields.size()) continue;
    mounts.push_back(MountInfo{unescape_mountinfo(fields[3]), unescape_mountinfo(fields[4]),
                               std::string(fields[5]), std::string(fields[dash + 1]),
                               unescape_mountinfo(fields[dash + 2]),
                               std::string(fields[dash + 3])});
  }
  return mounts;
}

// write() that cannot raise SIGPIPE in the host: SIGPIPE is blocked on this thread for the call,
// and one it generated is consumed before unblocking. (The host's own disposition of SIGPIPE is
// not ours to change; MSG_NOSIGNAL exists only for sockets.)
long write_without_sigpipe(int fd, const char* data, std::size_t size) {
  sigset_t pipe_only, previous, pending;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
  sigpending(&pending);
  const bool already_pending = sigismember(&pending, SIGPIPE);
  const long written = write(fd, data, size);
  const int error = errno;
  if (written < 0 && error == EPIPE && !already_pending) {
    const timespec no_wait{};
    while (sigtimedwait(&pipe_only, nullptr, &no_wait) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = error;
  return written;
}

long send_with_fds(int socket, std::string_view data, std::span<const int> fds,
                   int flags) noexcept {
  if (fds.size() > kMaxSentFds) {
    errno = EINVAL;
    return -1;
  }
  iovec io{const_cast<char*>(data.data()), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxSentFds)] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  while ((sent = ::sendmsg(socket, &message, MSG_NOSIGNAL | flags)) < 0 && errno == EINTR) {
  }
  return sent;
}

int send_fd(int socket, int fd) noexcept {
  const char byte = 0;
  const long sent = send_with_fds(socket, {&byte, 1}, {&fd, 1});
  return sent == 1 ? 0 : (sent < 0 ? errno : EIO);
}

Received receive_with_fds(int socket, std::span<char> data, std::span<int> fds,
                          int flags) noexcept {
  constexpr std::size_t kMaxFds = 16;  // room on the stack; a caller asking for more gets 16
  const std::size_t room = std::min(fds.size(), kMaxFds);
  iovec io{data.data(), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = room ? control : nullptr;
  message.msg_controllen = room ? CMSG_SPACE(sizeof(int) * room) : 0;
  Received received;
  ssize_t count;
  while ((count = ::recvmsg(socket, &message, flags | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  received.bytes = count;
  if (count < 0) {
    received.error = errno;
    return received;
  }
  received.truncated = (message.msg_flags & MSG_CTRUNC) != 0;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t number = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < number; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      if (received.fds < room) {
        fds[received.fds++] = fd;
      } else {  // alignment slack let one more in than asked for
        ::close(fd);
        received.truncated = true;
      }
    }
  }
  return received;
}

}  // namespace rlm::sys
