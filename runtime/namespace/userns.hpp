// The sandbox's user namespace: which ids the sandbox sees, which host ids they are, and who owns
// the namespace. The sandbox user (policy.user, e.g. 1000) is the only id mapped; uid 0 of the
// namespace is not mapped at all, so nothing inside can ever be "root" there.
//
// Per-user kernel counters (ucounts) are charged per (user namespace, uid) and, one level up, to
// the namespace's OWNER, which is the effective uid of the process that created it. So a root
// runtime maps each sandbox to a host uid of its own (sandbox_uid.hpp) and creates the namespace
// with that uid as its effective uid: everything the sandbox does is counted against that uid at
// every level, never against root or another sandbox.
#pragma once

#include <linux/capability.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "host/sandbox_uid.hpp"
#include "namespace/child_setup.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {

// The allocator lives in runtime/host (the landlock backend uses it too).
using host::kUidRangeVariable;
using host::sandbox_uid_range;
using host::SandboxUid;
using host::UidRange;

struct IdMapping {
  uid_t uid = 0, host_uid = 0;  // inside -> host
  gid_t gid = 0, host_gid = 0;
  // Privileged runtime (root): the host uid and gid are one number of the sandbox uid range, held
  // by `slot` for the sandbox's life; the namespace is created owned by it (OwnerSwitch); the child
  // drops the supplementary groups it inherited (root's, which would otherwise still grant their
  // group permissions on bound host files). Rootless: the runtime's own ids (the only ones an
  // unprivileged map may name), its groups kept (they are the caller's own), and setgroups denied
  // as the kernel requires for an unprivileged map.
  bool privileged = false;
  SandboxUid slot;               // privileged only
  std::string uid_map, gid_map;  // the lines written to /proc/PID/{uid,gid}_map

  // The new namespace's own limits of per-user counters (/proc/sys/user/*, which the child may
  // write while it holds CAP_SYS_RESOURCE there): half of the runtime's for inotify instances and
  // watches and fanotify groups and marks, so that one sandbox never takes a whole per-user budget
  // even where it shares its uid with others (rootless); no user namespaces nested in it.
  struct NamespaceLimit {
    std::string path, value, step;  // step: "limit <path>", for a ChildFailure
  };
  std::vector<NamespaceLimit> namespace_limits;
};

// Parent, before clone. Privileged: takes the first free uid of sandbox_uid_range() (throws
// rlm::Error when the range is malformed or every uid of it is held).
IdMapping prepare_id_mapping(const User& user);

// Parent, around clone (privileged runtime only; a no-op rootless): for the object's life the
// calling thread, and only it, has the sandbox's host uid and gid as its effective ids, so that the
// user namespace the clone creates is owned by them; its capabilities and filesystem ids stay
// root's (the clone still may create the namespaces and enter the run's cgroup). The destructor,
// in the parent right after the clone, puts the thread back as it was; the child keeps the
// switched ids until apply_ids(). Raw syscalls only: glibc's set*id wrappers would broadcast the
// change to every thread of the process. Make it with every signal blocked, as the clone requires
// anyway.
class OwnerSwitch {
 public:
  // Throws SetupError (step "setresuid (namespace owner)", ...) when a step fails; the thread is
  // then as it was.
  explicit OwnerSwitch(const IdMapping& mapping);
  ~OwnerSwitch();  // aborts if the thread cannot get its ids back (never left half-root)
  OwnerSwitch(const OwnerSwitch&) = delete;
  OwnerSwitch& operator=(const OwnerSwitch&) = delete;

 private:
  void restore() noexcept;
  bool switched_ = false;
  uid_t euid_ = 0, suid_ = 0;
  gid_t egid_ = 0;
  __user_cap_data_struct caps_[2]{};
};

// Parent, after clone while the child waits: setgroups, gid_map, uid_map, written by the calling
// thread as the namespace's owner (an OwnerSwitch, every signal blocked), so a root runtime needs
// no CAP_SYS_ADMIN for them (a container's root has none). Throws SetupError
// (step "write /proc/<pid>/uid_map", ...).
void write_id_maps(pid_t child, const IdMapping& mapping);

// Child, once the maps are written: drop supplementary groups (privileged), then become the
// sandbox gid and uid, then, when `set_namespace_limits` (the namespace's first process), write
// the namespace's own limits (namespace_limits): they belong to the namespace, so a recycled
// sandbox's next init, which joins the same one, finds them set. Every capability of the new user
// namespace is kept: the kernel clears them on leaving uid 0, and uid 0 is not mapped here. Raw
// syscalls only.
bool apply_ids(const IdMapping& mapping, bool set_namespace_limits,
               process::ChildFailure& failure) noexcept;

// What to run to allow unprivileged user namespaces on this host ("" when nothing known applies).
std::string user_namespace_fix();

}  // namespace rlm::ns
