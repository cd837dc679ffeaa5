// Names the kernel-facing parts of a policy use, checked against the libraries that will apply
// them: syscall names against libseccomp, capability names against libcap. A policy that names
// something these libraries do not know is rejected when it is loaded, not when a run starts.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::policy {

// True when libseccomp knows `name` (on any architecture it supports, as Docker profiles list
// syscalls of several architectures side by side).
bool is_known_syscall(std::string_view name);
// Every syscall name of the native architecture, for did-you-mean suggestions.
const std::vector<std::string>& native_syscall_names();

// "NET_ADMIN", "cap_net_admin", "CAP_NET_ADMIN" -> "CAP_NET_ADMIN"; nullopt when unknown.
std::optional<std::string> canonical_capability(std::string_view name);
// Every capability libcap knows, canonical form.
const std::vector<std::string>& capability_names();

// The Docker/OCI spellings the policy accepts.
inline constexpr std::string_view kSeccompActions[] = {
    "SCMP_ACT_ALLOW",       "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD", "SCMP_ACT_TRAP",  "SCMP_ACT_LOG"};
inline constexpr std::string_view kSeccompOperators[] = {
    "SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE",       "SCMP_CMP_EQ",
    "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"};

}  // namespace rlm::policy
