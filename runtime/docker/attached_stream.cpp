#include "docker/attached_stream.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "rlm_sys/sys.hpp"
#include "supervisor/payload_io.hpp"

namespace rlm::docker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunk = 64 * 1024;

// The payload's stdin, from the request's bytes or the caller's fd, into the connection.
class StdinFeed {
 public:
  StdinFeed(int socket, const StreamSettings& settings)
      : socket_(socket),
        source_fd_(settings.stdin_fd),
        data_(settings.stdin_fd >= 0 ? std::string_view() : settings.stdin_data),
        done_(!settings.feeds_stdin) {
    if (source_fd_ >= 0) buffer_.resize(kChunk);
    if (!done_) finish_if_drained();
  }

  bool wants_to_write() const { return !done_ && !pending().empty(); }
  int read_fd() const { return !done_ && source_fd_ >= 0 && pending().empty() ? source_fd_ : -1; }

  void on_writable() {
    const auto bytes = pending();
    const ssize_t sent = ::send(socket_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      consume(static_cast<std::size_t>(sent));
      finish_if_drained();
    } else if (sent < 0 && errno != EAGAIN && errno != EINTR) {
      done_ = true;  // the payload's stdin is gone (it exited or closed it): stop feeding
    }
  }

  void on_readable() {
    const ssize_t got = ::read(source_fd_, buffer_.data(), buffer_.size());
    if (got > 0) {
      begin_ = 0;
      end_ = static_cast<std::size_t>(got);
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      source_done_ = true;
      finish_if_drained();
    }
  }

 private:
  std::string_view pending() const {
    if (source_fd_ < 0) return data_;
    return {buffer_.data() + begin_, end_ - begin_};
  }
  void consume(std::size_t count) {
    if (source_fd_ < 0)
      data_.remove_prefix(count);
    else
      begin_ += count;
  }
  void finish_if_drained() {
    const bool source_ended = source_fd_ < 0 || source_done_;
    if (!pending().empty() || !source_ended) return;
    // Half-close: the daemon sees EOF and closes the payload's stdin; output keeps coming.
    ::shutdown(socket_, SHUT_WR);
    done_ = true;
  }

  int socket_;
  int source_fd_;
  std::string_view data_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool source_done_ = false;
  bool done_;
};

}  // namespace

bool FrameDemuxer::take_header() {
  const unsigned char kind = header_[0];
  if (kind > 2 || header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
    malformed_ = true;
    return false;
  }
  current_ = static_cast<StreamKind>(kind);
  payload_left_ = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16) |
                  (std::uint32_t{header_[6]} << 8) | std::uint32_t{header_[7]};
  header_filled_ = 0;
  return true;
}

bool FrameDemuxer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    if (stopped_ || malformed_) return false;
    if (payload_left_ == 0) {
      const std::size_t take = std::min(bytes.size(), header_.size() - header_filled_);
      std::copy_n(bytes.data(), take, header_.data() + header_filled_);
      header_filled_ += take;
      bytes.remove_prefix(take);
      if (header_filled_ == header_.size() && !take_header()) return false;
      continue;
    }
    const std::size_t take = std::min<std::size_t>(bytes.size(), payload_left_);
    payload_left_ -= static_cast<std::uint32_t>(take);
    if (!sink_(current_, bytes.substr(0, take))) stopped_ = true;
    bytes.remove_prefix(take);
  }
  return !stopped_ && !malformed_;
}

StreamSettings stream_settings(const Request& request, const Policy& policy,
                               std::chrono::steady_clock::time_point deadline) {
  StreamSettings settings;
  settings.feeds_stdin = wants_stdin(request);
  settings.stdin_data = request.stdin_data;
  settings.stdin_fd = request.stdin_fd;
  settings.output_cap = policy.limits.output_bytes;
  settings.on_stdout = request.on_stdout;
  settings.on_stderr = request.on_stderr;
  settings.deadline = deadline;
  settings.stop_fd = request.stop_fd;
  return settings;
}

StreamOutcome pump_stream(HijackedConnection& connection, const StreamSettings& settings) {
  StreamOutcome outcome;
  supervisor::CappedOutput out(settings.output_cap, settings.on_stdout, outcome.stdout_data);
  supervisor::CappedOutput err(settings.output_cap, settings.on_stderr, outcome.stderr_data);
  bool stop = false;

  FrameDemuxer demuxer([&](StreamKind kind, std::string_view data) {
    auto& target = kind == StreamKind::stderr_stream ? err : out;
    try {
      if (target.accept(data)) {
        outcome.end = StreamEnd::output_limit;
        stop = true;
        return false;
      }
    } catch (...) {
      outcome.caller_error = std::current_exception();
      outcome.end = StreamEnd::caller_error;
      out.silence();
      err.silence();
      stop = true;
      return false;
    }
    return true;
  });

  const int socket = connection.fd.get();
  StdinFeed stdin_feed(socket, settings);
  const auto take = [&](std::string_view bytes) {
    if (!demuxer.feed(bytes) && demuxer.malformed()) {
      outcome.protocol_error = "the Docker daemon's output stream is not in its framed format";
      stop = true;
    }
  };
  take(connection.early_bytes);
  connection.early_bytes.clear();

  std::vector<char> buffer(kChunk);
  bool closed = false;
  while (!stop && !closed) {
    if (Clock::now() >= settings.deadline) {
      outcome.end = StreamEnd::deadline;
      break;
    }
    enum { kSocket, kSource, kStop, kLimit, kSlots };
    pollfd fds[kSlots] = {
        {socket, static_cast<short>(POLLIN | (stdin_feed.wants_to_write() ? POLLOUT : 0)), 0},
        {stdin_feed.read_fd(), POLLIN, 0},
        {settings.stop_fd, POLLIN, 0},
        {settings.limit_fd, POLLIN, 0},
    };
    if (::poll(fds, kSlots, sys::poll_timeout_ms(settings.deadline)) < 0) continue;  // EINTR
    if (fds[kStop].revents & (POLLIN | POLLHUP | POLLERR)) {
      outcome.end = StreamEnd::cancelled;
      break;
    }
    if (fds[kLimit].revents & (POLLIN | POLLHUP | POLLERR)) {
      outcome.end = StreamEnd::cpu_limit;
      break;
    }
    if (fds[kSocket].revents & POLLOUT) stdin_feed.on_writable();
    if (fds[kSource].revents & (POLLIN | POLLHUP | POLLERR)) stdin_feed.on_readable();
    if (fds[kSocket].revents & (POLLIN | POLLHUP | POLLERR)) {
      // Drain what is there; EOF means the daemon closed the payload's output.
      for (;;) {
        const ssize_t got = ::recv(socket, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (got > 0) {
          take({buffer.data(), static_cast<std::size_t>(got)});
          if (stop) break;
          continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
        break;
      }
    }
  }
  outcome.stdout_truncated = out.truncated();
  outcome.stderr_truncated = err.truncated();
  return outcome;
}

}  // namespace rlm::docker
