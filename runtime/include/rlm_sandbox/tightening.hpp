// Whether one policy only tightens another: what a server checks before it runs a client's
// policy (docs/pools-and-server.md). A client may lower limits, drop mounts, make binds
// read-only, keep more namespaces, drop capabilities, add seccomp rules that only refuse more;
// it may add a bind only beneath a host directory it was permitted.
#pragma once

#include <string>
#include <vector>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm {

struct PermittedBind {
  std::string beneath;    // absolute host directory: a new bind's source must be it or below it
  bool writable = false;  // whether such a bind may be read-write
};

// Every way `candidate` is looser than `base` (a limit raised, a namespace dropped, a mount added
// outside `permitted` or made writable, network opened, a capability added, a seccomp rule
// removed or relaxed, the sandbox user changed, another backend preferred, unisolated runs
// allowed, kernel-interface binds allowed), each located by its JSON path like a policy error.
// Empty when `candidate` only tightens `base`.
std::vector<Diagnostic> loosenings(const Policy& base, const Policy& candidate,
                                   const std::vector<PermittedBind>& permitted);

// `policy` with its network narrowed to the allow entries `entries` (`run --allow-net`): its own
// allowlist cut to them, or, for a policy on the host's network, an allowlist of them; its deny
// entries, private setting and limits kept, injections for hosts no longer allowed dropped.
// Throws PolicyError listing each malformed entry, and Error when the policy's network is none or
// an entry lets through more than the policy's allowlist. `source` names the entries in those
// messages (`--allow-net[1]`, `narrow_network[0]`).
Policy narrow_network(Policy policy, const std::vector<std::string>& entries,
                      std::string_view source = "--allow-net");

}  // namespace rlm
