#include "egress/relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <vector>

#include "host/unique_fd.hpp"

namespace rlm::egress {
namespace {

// Each direction's pipe: 1 MiB where the kernel lets us size it (fewer wake-ups per byte:
// bulk throughput), else the default 64 KiB.
constexpr std::size_t kWantedPipeBytes = 1 << 20, kDefaultPipeBytes = 65536;

struct Direction {
  int from = -1, to = -1;
  host::UniqueFd pipe_read, pipe_write;
  std::size_t in_pipe = 0, capacity = kDefaultPipeBytes;
  bool eof = false, shut = false;
  std::uint64_t* moved = nullptr;
  bool done() const { return eof && in_pipe == 0 && shut; }
};

bool make_pipe(Direction& direction) {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  direction.pipe_read = host::UniqueFd(ends[0]);
  direction.pipe_write = host::UniqueFd(ends[1]);
  if (const int size = fcntl(ends[1], F_SETPIPE_SZ, static_cast<int>(kWantedPipeBytes)); size > 0)
    direction.capacity = static_cast<std::size_t>(size);
  return true;
}

// Moves exactly `length` bytes already waiting on `from` into the pipe (there is room).
bool splice_exactly(Direction& direction, std::size_t length) {
  while (length > 0) {
    const ssize_t moved = splice(direction.from, nullptr, direction.pipe_write.get(), nullptr,
                                 length, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return false;
    direction.in_pipe += static_cast<std::size_t>(moved);
    *direction.moved += static_cast<std::uint64_t>(moved);
    length -= static_cast<std::size_t>(moved);
  }
  return true;
}

enum class Step { more, blocked, eof, failed, refused };

// Reads what `from` has into the pipe; the sandbox's side through its gate.
Step fill(Direction& direction, ClientGate* gate, std::vector<std::uint8_t>& window, bool hung_up) {
  const std::size_t room = direction.capacity - direction.in_pipe;
  if (room == 0) return Step::blocked;
  if (!gate || gate->passes_everything()) {
    const ssize_t moved = splice(direction.from, nullptr, direction.pipe_write.get(), nullptr, room,
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (moved == 0) return Step::eof;
    if (moved < 0 && errno == EINTR) return Step::more;
    if (moved < 0) return errno == EAGAIN ? Step::blocked : Step::failed;
    direction.in_pipe += static_cast<std::size_t>(moved);
    *direction.moved += static_cast<std::uint64_t>(moved);
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
  return splice_exactly(direction, *admitted) ? Step::more : Step::failed;
}

bool drain(Direction& direction) {
  while (direction.in_pipe > 0) {
    const ssize_t moved = splice(direction.pipe_read.get(), nullptr, direction.to, nullptr,
                                 direction.in_pipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (moved < 0 && errno == EINTR) continue;
    if (moved < 0 && errno == EAGAIN) return true;
    if (moved <= 0) return false;
    direction.in_pipe -= static_cast<std::size_t>(moved);
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
    if (!make_pipe(direction)) return RelayEnd::failed;

  for (;;) {
    if (directions[0].done() && directions[1].done()) return RelayEnd::closed;
    if (count.out + count.in > max_bytes) return RelayEnd::limit;
    std::array<pollfd, 5> fds{};
    std::size_t used = 0;
    int watch[2][2] = {{-1, -1}, {-1, -1}};  // [direction][from, to] -> index in fds
    for (std::size_t d = 0; d < 2; ++d) {
      auto& direction = directions[d];
      if (!direction.eof && direction.in_pipe < direction.capacity) {
        watch[d][0] = static_cast<int>(used);
        fds[used++] = {direction.from, POLLIN | POLLRDHUP, 0};
      }
      if (direction.in_pipe > 0) {
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
      // as much as the sockets and the pipe hold.
      const short revents =
          watch[d][0] >= 0 ? fds[static_cast<std::size_t>(watch[d][0])].revents : 0;
      bool readable = revents != 0;
      const bool hung_up = (revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
      for (;;) {
        bool progress = false;
        if (readable && !direction.eof) {
          const std::size_t before = direction.in_pipe;
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
          progress = direction.in_pipe != before;
        }
        if (direction.in_pipe > 0) {
          const std::size_t before = direction.in_pipe;
          if (!drain(direction)) return RelayEnd::failed;
          progress = progress || direction.in_pipe != before;
        }
        if (!progress) break;
        if (count.out + count.in > max_bytes) return RelayEnd::limit;
      }
      if (direction.eof && direction.in_pipe == 0 && !direction.shut) {
        shutdown(direction.to, SHUT_WR);
        direction.shut = true;
      }
    }
  }
}

}  // namespace rlm::egress
