// What a Request may ask of the docker backend, checked before anything starts.
#pragma once

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::docker {

// Throws NeedsFullBinary when this build has no HTTP client, and Error for request fields a
// container cannot honour (inherited file descriptors).
void require_runnable(const Request& request);

// True when the payload's stdin carries data (Request::stdin_data or stdin_fd); otherwise it is
// /dev/null, as Docker gives a container without an attached stdin.
inline bool wants_stdin(const Request& request) {
  return request.stdin_fd >= 0 || !request.stdin_data.empty();
}

}  // namespace rlm::docker
