#include "docker/hijack.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <system_error>

#include "docker/engine_api.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::docker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxHeaderBytes = 64 * 1024;

// Waits until `fd` is ready for `events`; false when the deadline passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, sys::poll_timeout_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

void send_all(int fd, std::string_view data, Clock::time_point deadline, const std::string& what) {
  while (!data.empty()) {
    const ssize_t sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      data.remove_prefix(static_cast<std::size_t>(sent));
    } else if (sent < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline))
        throw DaemonError("the Docker daemon did not take " + what + " in time");
    } else {
      throw DaemonError("cannot send " + what + " to the Docker daemon: " + sys::errno_text(errno));
    }
  }
}

long status_of(std::string_view headers) {
  // "HTTP/1.1 101 UPGRADED"
  const auto space = headers.find(' ');
  if (space == std::string_view::npos) return 0;
  long status = 0;
  const char* begin = headers.data() + space + 1;
  std::from_chars(begin, headers.data() + headers.size(), status);
  return status;
}

std::size_t content_length_of(std::string_view headers) {
  std::string lower(headers);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto at = lower.find("\r\ncontent-length:");
  if (at == std::string::npos) return kMaxHeaderBytes;  // read what comes, up to a bound
  std::size_t length = 0;
  auto begin = lower.data() + at + 17;
  while (*begin == ' ') ++begin;
  std::from_chars(begin, lower.data() + lower.size(), length);
  return std::min(length, kMaxHeaderBytes);
}

}  // namespace

HijackedConnection open_hijacked(const std::string& socket_path, std::string_view method,
                                 const std::string& path, const std::optional<std::string>& body,
                                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string what = std::string(method) + " " + path.substr(0, path.find('?'));

  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof address.sun_path)
    throw DaemonError("the Docker socket path " + socket_path + " is too long");
  socket_path.copy(address.sun_path, socket_path.size());
  host::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw DaemonError("cannot create a unix socket: " + sys::errno_text(errno));
  // A unix-socket connect does not block on the network; only the exchange after it is timed.
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const int error = errno;
    auto problem = socket_problem(socket_path);
    throw DaemonError(problem.empty()
                          ? "cannot connect to " + socket_path + ": " + sys::errno_text(error)
                          : problem);
  }
  if (::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK) != 0)
    throw DaemonError("cannot make the Docker connection nonblocking: " + sys::errno_text(errno));

  std::string request = std::string(method) + " /v" + std::string(kApiVersion) + path +
                        " HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n";
  if (body)
    request += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body->size()) +
               "\r\n\r\n" + *body;
  else
    request += "Content-Length: 0\r\n\r\n";
  send_all(fd.get(), request, deadline, what);

  std::string received;
  std::size_t header_end = std::string::npos;
  char buffer[8192];
  while (header_end == std::string::npos) {
    if (received.size() > kMaxHeaderBytes)
      throw DaemonError("the Docker daemon's answer to " + what + " has oversized headers");
    const ssize_t got = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (got > 0) {
      received.append(buffer, static_cast<std::size_t>(got));
      header_end = received.find("\r\n\r\n");
    } else if (got == 0) {
      throw DaemonError("the Docker daemon closed the connection without answering " + what);
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!wait_for(fd.get(), POLLIN, deadline))
        throw DaemonError("the Docker daemon did not answer " + what + " in time");
    } else {
      throw DaemonError("cannot read the Docker daemon's answer to " + what + ": " +
                        sys::errno_text(errno));
    }
  }

  const std::string_view headers = std::string_view(received).substr(0, header_end + 2);
  const long status = status_of(headers);
  std::string rest = received.substr(header_end + 4);
  // 101 is the upgrade; a daemon that ignores Upgrade answers 200 and streams all the same.
  if (status == 101 || status == 200) return {std::move(fd), std::move(rest)};

  // An error: its JSON body says why.
  const std::size_t length = content_length_of(headers);
  while (rest.size() < length) {
    const ssize_t got = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (got > 0) {
      rest.append(buffer, static_cast<std::size_t>(got));
    } else if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd.get(), POLLIN, deadline)) break;
    } else {
      break;
    }
  }
  ApiReply reply;
  reply.status = status;
  reply.body = rest.substr(0, length);
  throw DaemonError(
      "Docker refused " + what + " (HTTP " + std::to_string(status) + "): " + reply.message(),
      status);
}

}  // namespace rlm::docker
