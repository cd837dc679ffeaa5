// Feeds the payload's stdin from Request::stdin_data or Request::stdin_fd without ever blocking
// the supervision loop: nonblocking writes to the pipe, reads from the caller's fd only when poll
// says it is readable. Closes the pipe at the end of the data so the payload sees EOF.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "common/unique_fd.hpp"

namespace rlm::common {

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

}  // namespace rlm::common
