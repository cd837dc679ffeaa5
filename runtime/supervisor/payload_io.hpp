// The payload's stdio on the host side: its stdin fed without ever blocking, its stdout and stderr
// each capped at the policy's output_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "host/unique_fd.hpp"

namespace rlm::supervisor {

using host::UniqueFd;

// Feeds the payload's stdin from Request::stdin_data or Request::stdin_fd without ever blocking
// the supervision loop: nonblocking writes to the pipe, reads from the caller's fd only when poll
// says it is readable. Closes the pipe at the end of the data so the payload sees EOF.

class StdinPump {
 public:
  // `data` must outlive the pump. `source_fd` >= 0 replaces `data`; it is read until EOF and never
  // closed or switched to nonblocking mode (it is the caller's, and may be shared).
  StdinPump(UniqueFd pipe, std::string_view data, int source_fd);

  // The fd to poll for POLLOUT (the pipe, while bytes are waiting), or -1.
  int write_fd() const;
  // The fd to poll for POLLIN (the caller's fd, while the buffer is empty), or -1.
  int read_fd() const;

  void on_writable();
  void on_readable();
  // The payload is gone: stop feeding it.
  void close() { pipe_.reset(); }

 private:
  std::string_view pending() const;
  void consume(std::size_t count);
  void finish_if_done();

  UniqueFd pipe_;
  std::string_view data_;
  int source_fd_;
  bool source_done_;
  std::vector<char> buffer_;  // allocated only when reading from source_fd
  std::size_t buffer_begin_ = 0, buffer_end_ = 0;
};

// One output stream of the payload, capped at the policy's output_bytes: kept in a string or handed
// to a callback as it arrives. Never holds more than the cap, whatever the payload writes.
class CappedOutput {
 public:
  using Sink = std::function<void(std::string_view)>;
  // With a sink, data goes there and `kept` stays empty; without one, it is appended to `kept`.
  CappedOutput(std::uint64_t cap, Sink sink, std::string& kept);

  // Takes a chunk read from the payload. Returns true when this chunk crossed the cap: the part
  // that fits has been taken, the rest is dropped, and so is everything after it. Exceptions
  // thrown by the sink propagate.
  bool accept(std::string_view chunk);

  bool truncated() const { return truncated_; }
  // Stop delivering (the sink threw); later data is counted as dropped.
  void silence() { silenced_ = true; }

 private:
  std::uint64_t cap_;
  std::uint64_t taken_ = 0;
  Sink sink_;
  std::string& kept_;
  bool truncated_ = false;
  bool silenced_ = false;
};

}  // namespace rlm::supervisor
