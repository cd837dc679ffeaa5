// A client that speaks the server's protocol by hand, for tests that send what no real client
// would: raw bytes, stalled frames, odd fds, connections made as another uid.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "host/unique_fd.hpp"
#include "rlm_sys/sys.hpp"
#include "server/wire.hpp"

namespace rlm::test {

inline int connect_raw(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  return fd;
}

// The server's answer: a frame, or an empty object when it closed the connection without one
// (or sent nothing within `wait`).
inline nlohmann::json answer(int fd, std::chrono::seconds wait = std::chrono::seconds(30)) {
  try {
    auto frame =
        server::receive_frame(fd, server::Clock::now() + wait, std::chrono::seconds(10), 1u << 24);
    return frame ? frame->message : nlohmann::json::object();
  } catch (const Error&) {
    return nlohmann::json::object();
  }
}

inline void send_bytes(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// Sends what the peer takes of `bytes` within `wait`; stops early when the peer closes. Returns
// how many bytes went.
inline std::size_t send_what_is_taken(int fd, const std::string& bytes,
                                      std::chrono::seconds wait = std::chrono::seconds(60)) {
  const auto deadline = server::Clock::now() + wait;
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t count =
        send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (count > 0) {
      sent += static_cast<std::size_t>(count);
      continue;
    }
    if (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    pollfd entry{fd, POLLOUT, 0};
    if (poll(&entry, 1, sys::poll_timeout_ms(deadline)) <= 0) break;
    if (entry.revents & (POLLERR | POLLHUP)) break;
  }
  return sent;
}

inline std::string header(std::uint32_t size) {
  return {static_cast<char>(size >> 24), static_cast<char>(size >> 16),
          static_cast<char>(size >> 8), static_cast<char>(size)};
}

inline std::string frame_bytes(const std::string& body) {
  return header(static_cast<std::uint32_t>(body.size())) + body;
}

// `count` connections to `path` made by a child process running as `uid` (gid the same, no
// supplementary groups): the server sees that uid in SO_PEERCRED for each. In connection order.
inline std::vector<host::UniqueFd> connections_as(uid_t uid, const std::string& path,
                                                  std::size_t count) {
  std::vector<host::UniqueFd> connections;
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return connections;
  const pid_t child = fork();
  if (child == 0) {
    close(pair[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0)
      _exit(126);
    for (std::size_t i = 0; i < count; ++i) {
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) _exit(125);
      if (sys::send_with_fds(pair[1], "c", std::span<const int>(&fd, 1)) != 1) _exit(124);
      close(fd);
    }
    _exit(0);
  }
  close(pair[1]);
  for (std::size_t i = 0; i < count; ++i) {
    char byte;
    int fd = -1;
    const auto got =
        sys::receive_with_fds(pair[0], std::span<char>(&byte, 1), std::span<int>(&fd, 1));
    if (got.bytes != 1 || got.fds != 1) break;
    connections.emplace_back(fd);
  }
  close(pair[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child connecting as uid " << uid << " failed: " << status;
  EXPECT_EQ(connections.size(), count);
  return connections;
}

// The server's resident memory (VmRSS), in bytes; 0 when it cannot be read.
inline std::uint64_t resident_bytes(pid_t pid) {
  FILE* file = fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!file) return 0;
  char line[256];
  std::uint64_t kib = 0;
  while (fgets(line, sizeof line, file))
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtoull(line + 6, nullptr, 10);
  fclose(file);
  return kib << 10;
}

}  // namespace rlm::test
