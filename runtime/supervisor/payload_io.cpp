#include "supervisor/payload_io.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "rlm_sys/sys.hpp"

namespace rlm::supervisor {

StdinPump::StdinPump(UniqueFd pipe, std::string_view data, int source_fd)
    : pipe_(std::move(pipe)),
      data_(source_fd >= 0 ? std::string_view() : data),
      source_fd_(source_fd),
      source_done_(source_fd < 0) {
  if (source_fd_ >= 0) buffer_.resize(65536);
  finish_if_done();
}

int StdinPump::write_fd() const {
  return pipe_ && !pending().empty() ? pipe_.get() : -1;
}

int StdinPump::read_fd() const {
  return pipe_ && !source_done_ && pending().empty() ? source_fd_ : -1;
}

std::string_view StdinPump::pending() const {
  if (source_fd_ < 0) return data_;
  return {buffer_.data() + buffer_begin_, buffer_end_ - buffer_begin_};
}

void StdinPump::consume(std::size_t count) {
  if (source_fd_ < 0) {
    data_.remove_prefix(count);
    return;
  }
  buffer_begin_ += count;
  if (buffer_begin_ == buffer_end_) buffer_begin_ = buffer_end_ = 0;
}

void StdinPump::on_writable() {
  const auto bytes = pending();
  if (!pipe_ || bytes.empty()) return;
  const ssize_t written = sys::write_without_sigpipe(pipe_.get(), bytes.data(), bytes.size());
  if (written > 0) {
    consume(static_cast<std::size_t>(written));
  } else if (written < 0 && errno != EAGAIN && errno != EINTR) {
    // EPIPE: the payload stopped reading its stdin, which is its right.
    pipe_.reset();
    return;
  }
  finish_if_done();
}

void StdinPump::on_readable() {
  if (source_done_ || !pending().empty()) return;
  const ssize_t count = read(source_fd_, buffer_.data(), buffer_.size());
  if (count > 0) {
    buffer_begin_ = 0;
    buffer_end_ = static_cast<std::size_t>(count);
  } else if (count == 0 || (errno != EAGAIN && errno != EINTR)) {
    source_done_ = true;  // EOF, or an error that would only repeat
  }
  finish_if_done();
}

void StdinPump::finish_if_done() {
  if (source_done_ && pending().empty()) pipe_.reset();
}

CappedOutput::CappedOutput(std::uint64_t cap, Sink sink, std::string& kept)
    : cap_(cap), sink_(std::move(sink)), kept_(kept) {}

bool CappedOutput::accept(std::string_view chunk) {
  if (truncated_) return false;
  const auto room = static_cast<std::size_t>(std::min<std::uint64_t>(cap_ - taken_, chunk.size()));
  const bool crossed = room < chunk.size();
  truncated_ = crossed;
  taken_ += room;
  if (room > 0 && !silenced_) {
    if (sink_)
      sink_(chunk.substr(0, room));
    else
      kept_.append(chunk.data(), room);
  }
  return crossed;
}

}  // namespace rlm::supervisor
