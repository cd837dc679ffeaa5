// The limits part of rlm::loosenings (rlm_sandbox/tightening.hpp), for the library's own checks of
// a policy that may only tighten another: a Pool's run with a request's policy compares limits
// alone (any other difference takes the cold path there), with the same rules a server applies.
#pragma once

#include <vector>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::policy {

// Every limit of `candidate` above `base`'s (no CPU bandwidth limit is above any), located by its
// JSON path ("limits.memory_bytes"), in the order of Limits' fields. Empty when none is.
std::vector<Diagnostic> limit_loosenings(const Limits& base, const Limits& candidate);

}  // namespace rlm::policy
