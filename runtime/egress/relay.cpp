#include "egress/relay.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <vector>

namespace rlm::egress {
namespace {

// Each direction's buffer. Copying through it beats splice() through a pipe here: with loopback
// on both sides, the copy leaves the bytes in cache for the receiver, where a spliced page is
// handed on cold and in pieces (tools/bench/egress_bench.cpp measured 0.54 of direct loopback
// with a 1 MiB pipe, the copy more; docs/network.md has the figures). Its pages are touched
// only as far as bytes come, so a connection that carries little holds little.
constexpr std::size_t kBufferBytes = 1 << 20;

struct Direction {
  int from = -1, to = -1;
  std::unique_ptr<std::uint8_t[]> buffer;
  std::size_t start = 0, end = 0;  // the bytes held: [start, end)
  bool eof = false, shut = false;
  std::uint64_t* moved = nullptr;
  std::size_t held() const { return end - start; }
  std::size_t room() const { return kBufferBytes - end; }
  bool done() const { return eof && held() == 0 && shut; }
};

// Reads at most `length` bytes (waiting on `from`) into the buffer; -1 and errno on failure.
ssize_t take(Direction& direction, std::size_t length) {
  const ssize_t got =
      recv(direction.from, direction.buffer.get() + direction.end, length, MSG_DONTWAIT);
  if (got > 0) {
    direction.end += static_cast<std::size_t>(got);
    *direction.moved += static_cast<std::uint64_t>(got);
  }
  return got;
}

enum class Step { more, blocked, eof, failed, refused };

// Reads what `from` has into the buffer; the sandbox's side through its gate.
Step fill(Direction& direction, ClientGate* gate, std::vector<std::uint8_t>& window, bool hung_up) {
  if (direction.held() == 0) direction.start = direction.end = 0;
  const std::size_t room = direction.room();
  if (room == 0) return Step::blocked;
  if (!gate || gate->passes_everything()) {
    const ssize_t got = take(direction, room);
    if (got == 0) return Step::eof;
    if (got < 0 && errno == EINTR) return Step::more;
    if (got < 0) return errno == EAGAIN ? Step::blocked : Step::failed;
    return Step::more;
  }
  const ssize_t seen =
      recv(direction.from, window.data(), std::min(room, window.size()), MSG_PEEK | MSG_DONTWAIT);
  if (seen == 0) return Step::eof;
  if (seen < 0 && errno == EINTR) return Step::more;
  if (seen < 0) return errno == EAGAIN ? Step::blocked : Step::failed;
  const auto admitted = gate->admit(std::span(window.data(), static_cast<std::size_t>(seen)));
  if (!admitted) return Step::refused;
  if (*admitted == 0) {
    // The gate needs more than has come: a sandbox that stops here has said all it will.
    if (hung_up || static_cast<std::size_t>(seen) >= window.size()) return Step::eof;
    wake_beyond(direction.from, static_cast<std::size_t>(seen));
    return Step::blocked;
  }
  wake_beyond(direction.from, 0);
  // The admitted bytes are waiting (they were peeked): read exactly them, nothing beyond.
  for (std::size_t left = *admitted; left > 0;) {
    const ssize_t got = take(direction, left);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Step::failed;
    left -= static_cast<std::size_t>(got);
  }
  return Step::more;
}

bool drain(Direction& direction) {
  while (direction.held() > 0) {
    const ssize_t sent = send(direction.to, direction.buffer.get() + direction.start,
                              direction.held(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno == EAGAIN) return true;
    if (sent <= 0) return false;
    direction.start += static_cast<std::size_t>(sent);
  }
  return true;
}

}  // namespace

void wake_beyond(int fd, std::size_t bytes) {
  const int lowat = static_cast<int>(std::min<std::size_t>(bytes + 1, 1 << 20));
  setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
}

RelayEnd relay(int client, int upstream, int stop_fd, std::chrono::milliseconds idle,
               ClientGate* gate, RelayCount& count, std::uint64_t max_bytes) {
  std::vector<std::uint8_t> window(gate ? gate->window() : 0);
  std::array<Direction, 2> directions;
  directions[0].from = client;
  directions[0].to = upstream;
  directions[0].moved = &count.out;
  directions[1].from = upstream;
  directions[1].to = client;
  directions[1].moved = &count.in;
  for (auto& direction : directions)
    direction.buffer = std::make_unique_for_overwrite<std::uint8_t[]>(kBufferBytes);

  for (;;) {
    if (directions[0].done() && directions[1].done()) return RelayEnd::closed;
    if (count.out + count.in > max_bytes) return RelayEnd::limit;
    std::array<pollfd, 5> fds{};
    std::size_t used = 0;
    int watch[2][2] = {{-1, -1}, {-1, -1}};  // [direction][from, to] -> index in fds
    for (std::size_t d = 0; d < 2; ++d) {
      auto& direction = directions[d];
      if (!direction.eof && (direction.room() > 0 || direction.held() == 0)) {
        watch[d][0] = static_cast<int>(used);
        fds[used++] = {direction.from, POLLIN | POLLRDHUP, 0};
      }
      if (direction.held() > 0) {
        watch[d][1] = static_cast<int>(used);
        fds[used++] = {direction.to, POLLOUT, 0};
      }
    }
    const std::size_t stop_index = used;
    fds[used++] = {stop_fd, POLLIN, 0};
    const int ready = poll(fds.data(), used, static_cast<int>(idle.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return RelayEnd::failed;
    if (ready == 0) return RelayEnd::idle;
    if (fds[stop_index].revents) return RelayEnd::stopped;
    for (std::size_t d = 0; d < 2; ++d) {
      auto& direction = directions[d];
      // Move what there is until either side would block, then wait again: one wake-up moves
      // as much as the sockets and the buffer hold.
      const short revents =
          watch[d][0] >= 0 ? fds[static_cast<std::size_t>(watch[d][0])].revents : 0;
      bool readable = revents != 0;
      const bool hung_up = (revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
      for (;;) {
        bool progress = false;
        if (readable && !direction.eof) {
          const std::size_t before = direction.held();
          switch (fill(direction, d == 0 ? gate : nullptr, window, hung_up)) {
            case Step::more:
              break;
            case Step::blocked:
              readable = false;
              break;
            case Step::eof:
              direction.eof = true;
              break;
            case Step::failed:
              return RelayEnd::failed;
            case Step::refused:
              return RelayEnd::refused;
          }
          progress = direction.held() != before;
        }
        if (direction.held() > 0) {
          const std::size_t before = direction.held();
          if (!drain(direction)) return RelayEnd::failed;
          progress = progress || direction.held() != before;
        }
        if (!progress) break;
        if (count.out + count.in > max_bytes) return RelayEnd::limit;
      }
      if (direction.eof && direction.held() == 0 && !direction.shut) {
        shutdown(direction.to, SHUT_WR);
        direction.shut = true;
      }
    }
  }
}

}  // namespace rlm::egress
