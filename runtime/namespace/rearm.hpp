// A recycled sandbox's next init (docs/pools-and-server.md#recycled-sandboxes): the sandbox's
// user, network and mount namespaces (its built tree) and its cgroup are kept from run to run;
// each run gets a new PID, IPC and UTS namespace, a fresh /proc, /dev/shm and writable tmpfs in
// place of the last run's, and a new rlm-sandbox-init with the privileges, Landlock and seccomp
// of the first.
//
// The host's root clones the child (CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS, into the run's
// cgroup on v2; on v1 it joins the groups first), which then, with raw syscalls only
// (process/child_start.hpp): enters the sandbox's mount namespace, detaches the last run's /proc,
// /dev/shm and writable tmpfs and mounts fresh ones (RootfsPlan::prepare_refresh), enters its
// network namespace and sets the hostname -- as the host's root, which owns the new namespaces --
// and only then enters the sandbox's user namespace, becomes the sandbox uid and takes the same
// last steps as the first child (run_child): its cgroup namespace, the workdir, stdio, fds,
// privileges, Landlock, the exec of init. The new PID, IPC and UTS namespaces belong to the
// host's user namespace: the sandbox holds no capability over them at all. The mount namespace is
// the sandbox's own, which is why a policy that keeps a capability is not recycled.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>

#include "namespace/child.hpp"
#include "namespace/child_setup.hpp"
#include "namespace/userns.hpp"
#include "supervisor/launch.hpp"

namespace rlm::ns {

struct RearmPlan {
  int user_ns = -1, mount_ns = -1;  // the sandbox's, as nsfs fds (close-on-exec)
  int net_ns = -1;                  // -1: the policy shares the host's network
  // The parent keeps its end open until the exec: a hangup means it died (the parent-death
  // signal is set only after the id change, which clears it).
  int alive_read = -1, alive_write = -1;
  int error_read = -1, error_write = -1;  // ChildFailure records; close-on-exec
  // v1: the run's groups' `tasks` files, joined first (as ChildPlan::join_cgroup_fds); v2 clones
  // straight into the group.
  std::array<int, 4> join_cgroup_fds{-1, -1, -1, -1};
  const RootfsPlan* refresh = nullptr;  // as the host's root
  const RootfsPlan* workdir = nullptr;  // as the sandbox uid
  const char* hostname = nullptr;
  std::size_t hostname_length = 0;
  const IdMapping* ids = nullptr;
  bool cgroup_namespace = false;
  InitExec exec;  // as the first child's
};

[[noreturn]] void run_rearmed_child(const RearmPlan& plan) noexcept;

// Parent: why a sandbox of `policy` built by this runtime cannot be recycled, or "" when it can.
// `privileged`: a root runtime (only the host's root can own the next run's namespaces);
// `has_cgroup`: its run has a group (whose counters restart per run);
// `binds_reclaimed`: its read-write binds could not be idmapped.
std::string recycle_problem(const Policy& policy, bool privileged, bool has_cgroup,
                            bool binds_reclaimed);

// Parent: whether the network namespace of `pid` (a held init whose run has ended) holds no
// socket at all -- none bound, listening, connected or in TIME_WAIT, no unix socket, abstract or
// not -- as /proc/<pid>/net lists them. A run that left one there is not followed by another.
bool network_namespace_is_empty(pid_t pid);

}  // namespace rlm::ns
