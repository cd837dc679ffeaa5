// A context's bytes as an fd, the way they cross to a sandboxed worker (the hand-over,
// add_context) or to a server: the caller's file opened with the caller's rights, or a memfd
// holding the text. Either way a reader takes it to EOF from offset 0, whatever its size.
#pragma once

#include <string>

#include "host/unique_fd.hpp"

namespace rlm::host {

// `file` opened read-only when it is not empty, else a memfd holding `data` (at offset 0).
// Throws Error.
UniqueFd open_context_fd(const std::string& file, const std::string& data);

}  // namespace rlm::host
