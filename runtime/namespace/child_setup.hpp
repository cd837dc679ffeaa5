// The steps the cloned child takes between clone and exec, each prepared in the parent (where
// allocation is fine) and applied in the child with raw syscalls only: nothing in an apply()
// allocates, takes a lock or calls into a library that might. A failing step reports which one
// and errno through a pipe so the Result can say exactly what broke.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {

// Where a child-side step failed: a static string (never allocated) and the errno.
struct StepFailure {
  const char* step = nullptr;  // e.g. "mount /usr", "pivot_root"; points into the plan
  int error = 0;
};

// The sandbox's root filesystem: a fresh tmpfs holding read-only nosuid nodev binds from the
// policy (sources that are symlinks on the host, such as /bin -> usr/bin, become the same
// symlinks), a new /proc for the PID namespace with sensitive entries masked, a minimal /dev
// (null zero full random urandom tty, pts, shm, fd/stdin/stdout/stderr links), /tmp as a
// size-capped tmpfs, generated /etc/passwd and /etc/group naming the sandbox user, the workdir;
// then pivot_root, detach the old root, remount / read-only.
// Preconditions for apply(): in new user + mount (+ PID, for /proc) namespaces, holding
// CAP_SYS_ADMIN there, running as the sandbox uid/gid (which are mapped).
class RootfsPlan {
 public:
  static RootfsPlan prepare(const Policy& policy);
  bool apply(StepFailure& failure) const noexcept;

 private:
  struct Op;                  // defined in mounts.cpp
  std::vector<Op> ops_;       // executed in order
  std::vector<std::string> strings_;  // storage every Op's const char* points into
 public:
  RootfsPlan();
  ~RootfsPlan();
  RootfsPlan(RootfsPlan&&) noexcept;
  RootfsPlan& operator=(RootfsPlan&&) noexcept;
};

// Brings up "lo" in the new network namespace: the RTM_NEWLINK request is built with libnl in
// the parent; apply() only opens a netlink socket, sends those bytes and reads the ack.
class LoopbackPlan {
 public:
  static LoopbackPlan prepare();
  bool apply(StepFailure& failure) const noexcept;

 private:
  std::vector<std::uint8_t> request_;
};

// Privileges: the bounding set dropped except the policy's capabilities, securebits locked
// (NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE unless caps are kept, all
// locked), the kept capabilities raised as ambient so they survive exec as a non-root uid,
// and no_new_privs. Cap sets are computed with libcap in the parent; apply() uses capset/prctl.
class PrivilegePlan {
 public:
  static PrivilegePlan prepare(const Policy& policy);
  bool apply(StepFailure& failure) const noexcept;

 private:
  std::vector<int> drop_from_bounding_;
  std::vector<int> ambient_;
  std::uint32_t effective_[2] = {0, 0}, permitted_[2] = {0, 0}, inheritable_[2] = {0, 0};
};

}  // namespace rlm::ns
