// Async-signal-safe fd hygiene for the code between fork/clone and exec: close every fd from a
// first number up except a short list that is to cross into the child (and must lose
// close-on-exec there).
#pragma once

#include <array>
#include <cstddef>

namespace rlm::common {

// A request may pass this many fds to its payload (a session's channel and context, ...).
constexpr std::size_t kMaxInheritedFds = 4;
// Fds kept across the exec of init: those, plus the namespace backend's own (the error pipe,
// init's binary, two seccomp memfds). -1 marks an unused slot.
using KeptFds = std::array<int, kMaxInheritedFds + 4>;

// Closes every fd >= `first` that is not in `keep`; `ceiling` bounds the close() loop used on
// kernels without close_range. Raw syscalls only.
void close_fds_except(unsigned first, KeptFds keep, unsigned ceiling) noexcept;

// Clears close-on-exec on every fd of `keep`; false (errno set) when one fcntl fails.
bool clear_cloexec(const KeptFds& keep) noexcept;

}  // namespace rlm::common
