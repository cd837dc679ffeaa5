// The one record a child writes when it fails between fork/clone and exec: which step, and its
// errno. Fixed-size and trivially copyable, so the child fills it without allocating and writes
// it in one write(2) (at most PIPE_BUF bytes: atomic, never torn); the step's name is copied in,
// so no pointer into the parent's memory crosses the fork. The pipe it travels on is close-on-exec
// in the child, so EOF with nothing read means the exec succeeded.
#pragma once

#include <limits.h>

#include <cstddef>
#include <type_traits>

namespace rlm::process {

struct ChildFailure {
  // Room for a step that names a path ("bind /usr/lib/..."): the whole record is PIPE_BUF bytes.
  static constexpr std::size_t kStepCapacity = PIPE_BUF - sizeof(int);

  char step[kStepCapacity] = {};  // NUL-terminated; cut to fit
  int error = 0;                  // errno of the step

  bool failed() const noexcept { return step[0] != '\0' || error != 0; }
  // Copies `name` (null: "") and sets the errno. Async-signal-safe.
  void set(const char* name, int errno_value) noexcept;
  static ChildFailure at(const char* name, int errno_value) noexcept {
    ChildFailure failure;
    failure.set(name, errno_value);
    return failure;
  }
};
static_assert(std::is_trivially_copyable_v<ChildFailure>);
static_assert(sizeof(ChildFailure) <= PIPE_BUF, "one atomic write");

// Child: writes `failure` to `fd` (retrying EINTR) and _exits with `exit_code`.
[[noreturn]] void exit_with_failure(int fd, const ChildFailure& failure, int exit_code) noexcept;

// Parent: what the child said on `fd`, the read end of the record's pipe (the parent has closed
// its copy of the write end), waiting at most `timeout_ms` (-1: until the child exec'd or exited).
struct ChildReport {
  enum class Kind {
    exec,        // EOF without a record: the pipe closed on the exec (or the child died silently)
    failed,      // `failure` is the child's record
    timed_out,   // nothing within `timeout_ms`
    unreadable,  // poll or read failed, or a short record: `failure.error` says why (EIO: short)
  };
  Kind kind = Kind::exec;
  ChildFailure failure;
};
ChildReport read_child_report(int fd, int timeout_ms) noexcept;

}  // namespace rlm::process
