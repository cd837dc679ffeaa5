// Opening a file a policy names: only beneath a directory the loader holds open, never through a
// "..", an absolute symlink or a magic link that leads out of it (openat2 RESOLVE_BENEATH), so a
// policy from a repository cannot make the loader read files elsewhere on the host.
#pragma once

#include <string>

#include "host/unique_fd.hpp"

namespace rlm::policy {

// Opens `relative` (not starting with '/') beneath the directory `dir` with `flags` (O_CLOEXEC is
// added). On failure the result is empty and errno says why: EXDEV or ELOOP when the path leads
// out of `dir`, ENOSYS when the kernel has no openat2 (before Linux 5.6).
host::UniqueFd open_beneath(int dir, const std::string& relative, int flags);

}  // namespace rlm::policy
