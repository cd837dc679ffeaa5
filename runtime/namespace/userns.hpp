// The sandbox's user namespace: which ids the sandbox sees and which host ids they are. The
// sandbox user (policy.user, e.g. 1000) is the only id mapped; uid 0 of the namespace is not
// mapped at all, so nothing inside can ever be "root" there.
#pragma once

#include <sys/types.h>

#include <string>

#include "namespace/child_setup.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {

struct IdMapping {
  uid_t uid = 0, host_uid = 0;  // inside -> host
  gid_t gid = 0, host_gid = 0;
  // Privileged runtime (root): the host ids are nobody/nogroup and the child drops the
  // supplementary groups it inherited (root's, which would otherwise still grant their group
  // permissions on bound host files). Rootless: the runtime's own ids, its groups kept (they are
  // the caller's own), and setgroups denied as the kernel requires for an unprivileged map.
  bool privileged = false;
  std::string uid_map, gid_map;  // the lines written to /proc/PID/{uid,gid}_map
};

// Parent, before clone.
IdMapping prepare_id_mapping(const User& user);

// Parent, after clone while the child waits: setgroups, gid_map, uid_map. "" or what failed.
std::string write_id_maps(pid_t child, const IdMapping& mapping);

// Child, once the maps are written: drop supplementary groups (privileged), then become the
// sandbox gid and uid. Every capability of the new user namespace is kept: the kernel clears them
// on leaving uid 0, and uid 0 is not mapped here. Raw syscalls only.
bool apply_ids(const IdMapping& mapping, StepFailure& failure) noexcept;

// Whether this process can create the namespaces a default sandbox uses: clones a child into
// them that exits at once. "" when it can, else why (errno text).
std::string probe_user_namespaces();

// What to run to allow unprivileged user namespaces on this host ("" when nothing known applies).
std::string user_namespace_fix();

}  // namespace rlm::ns
