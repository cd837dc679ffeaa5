// The payload's seccomp filter as the namespace backend hands it to rlm-sandbox-init: compiled
// here (libseccomp allocates), written to sealed memfds that init reads and the payload installs
// as its last step. Two programs when the policy has kill actions: one with them compiled as user
// notifications (init then names the denied syscall), and the policy as written to fall back to.
#pragma once

#include "common/unique_fd.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {

struct PayloadFilter {
  common::UniqueFd kill;    // --seccomp-fd (always)
  common::UniqueFd notify;  // --seccomp-notify-fd; empty when the policy kills nothing, or when
                            // it denies what the payload must call after installing it
};

// Throws rlm::Error when the policy's rules do not compile, std::system_error when a memfd
// cannot be made.
PayloadFilter prepare_payload_filter(const Seccomp& rules);

}  // namespace rlm::ns
