// The mark a root runtime leaves on a directory it bound read-write for a root owner: what a
// sandbox writes there is idmapped to root (idmap.hpp), so a link it plants is root's like any
// link root made, and ownership can no longer tell the runtime not to follow it
// (resolve_host_source, docs/security.md #27). The mark is an extended attribute in the trusted
// namespace, which only a holder of CAP_SYS_ADMIN in the host's user namespace may read, set or
// remove: never a sandbox. A link at or beneath a marked directory is not followed in a bind
// source. Parent only; may allocate.
#pragma once

#include <optional>
#include <string>

namespace rlm::ns {

inline constexpr const char* kWrittenMarkName = "trusted.rlm-sandbox.written";

// Marks the directory open at `dir_fd` (a bind's source, opened without following a link) unless
// it is marked already. Throws Error at `where` with the fix when its filesystem keeps no trusted
// attributes.
void mark_sandbox_written(int dir_fd, const std::string& host_path, const std::string& where);

// The nearest of `path`'s directories (itself included, then its ancestors up to "/") that
// carries the mark, or nothing. `path` is absolute and resolved (no link among its components).
std::optional<std::string> sandbox_written_ancestor(const std::string& path);

}  // namespace rlm::ns
