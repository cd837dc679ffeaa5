// The steps the cloned child takes between clone and exec, each prepared in the parent (where
// allocation is fine) and applied in the child with raw syscalls only: nothing in an apply()
// allocates, takes a lock or calls into a library that might. A failing step reports which one
// and errno (a process::ChildFailure) through a pipe so the Result can say exactly what broke.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "host/unique_fd.hpp"
#include "process/child_failure.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::ns {

// The sandbox's root filesystem: a fresh tmpfs holding read-only nosuid nodev binds from the
// policy (sources that are symlinks on the host, such as /bin -> usr/bin, become the same
// symlinks), a new /proc for the PID namespace with sensitive entries masked, a minimal /dev
// (null zero full random urandom tty, pts, shm, fd/stdin/stdout/stderr links), /tmp as a
// size-capped tmpfs, generated /etc/passwd and /etc/group naming the sandbox user, the workdir;
// then the old root is detached, / remounted read-only, and the cwd set to the workdir.
// docs/namespace-rootfs.md describes the result.
// prepare() reads the host (sources, their mount flags, /proc/self/mountinfo, which /proc entries
// exist) and throws rlm::Error naming the JSON path of a mount it cannot honour (e.g.
// "filesystem.mounts[3].source: /opt/x does not exist on the host").
// Preconditions for apply(): in new user + mount + PID namespaces (it mounts /proc, so it must
// run in the PID namespace's first process or a descendant), holding CAP_SYS_ADMIN there,
// running as the sandbox uid/gid, which are mapped; /tmp exists in the mount namespace (the
// new root is staged on it), and the host's procfs is at /proc (mounts name their source and
// target by descriptor through its /proc/self/fd); openat2 exists (Linux 5.6). Every bind
// source must be reachable by the sandbox uid's host uid. After pivot_root no path is resolved
// through a symlink: a link in a mount target's, mount point's or the workdir's path fails the
// step with ELOOP.
class RootfsPlan {
 public:
  // A file the runtime writes into the root tmpfs, read-only to the sandbox (an allowlist's trust
  // store); `asked_by` is the policy field that wants it, named when a mount covers its path.
  struct GeneratedFile {
    std::string path, contents, asked_by;
  };
  static RootfsPlan prepare(const Policy& policy, const std::vector<GeneratedFile>& files = {});
  bool apply(process::ChildFailure& failure) const noexcept;

  // Parent, privileged runtime, after prepare(): each read-write bind of the policy becomes a
  // mount tree idmapped so that the sandbox's host ids stand for `owner`'s (idmap.hpp), which
  // apply() attaches in place of the bind. Throws Error naming the mount when one cannot be;
  // for root, false instead when this host cannot idmap (a container without CAP_SYS_ADMIN, a
  // filesystem without idmapped mounts), nothing changed.
  bool idmap_writable_binds(const HostIds& owner, uid_t host_uid, gid_t host_gid);
  std::vector<std::string> writable_bind_sources() const;  // their host paths
  bool has_writable_binds() const;

  // Recycling (docs/pools-and-server.md#recycled-sandboxes): what makes a built tree fresh for
  // the next run, applied by the host's root in the sandbox's mount namespace, inside the next
  // run's new PID namespace: the last run's /proc, /dev/shm and writable tmpfs detached, a new
  // /proc (masked as at first), and a new tmpfs on /dev/shm and on every writable tmpfs of the
  // policy, owned by `owner`:`group` (the sandbox uid's host ids). prepare_refresh_workdir(): the
  // workdir made again where it lies in such a tmpfs, and the chdir into it; applied as the sandbox
  // uid. refresh_problem(): why a policy's tree cannot be made fresh ("" when it can);
  // prepare_refresh throws Error with it.
  static std::string refresh_problem(const Policy& policy);
  static RootfsPlan prepare_refresh(const Policy& policy, uid_t owner, gid_t group);
  static RootfsPlan prepare_refresh_workdir(const Policy& policy);

  struct Op;  // opaque: one mount/mkdir/symlink/... step, defined in mounts.hpp

  // What the finished tree offers the sandbox, by its path there (after pivot_root): each bind
  // and tmpfs, /dev, /proc, the generated /etc files, and the root itself (directories only: its
  // files are the generated ones, listed on their own). The rules that follow the mounts
  // (LandlockPlan) are made from it.
  struct Reach {
    enum class Kind {
      list,       // the root tmpfs: its directories may be listed, nothing more
      read,       // a generated file
      read_exec,  // a read-only bind or tmpfs
      writable,   // a read-write bind or tmpfs
      device,     // /dev: the device nodes, their ioctls, /dev/shm, /dev/pts
      proc,       // the sandbox's own procfs (noexec)
    };
    std::string path;
    Kind kind = Kind::read;
  };
  const std::vector<Reach>& reach() const { return reach_; }

 private:
  std::vector<Op> ops_;  // executed in order; each owns the strings it passes to the kernel
  std::vector<Reach> reach_;
  std::vector<host::UniqueFd> trees_;  // the idmapped binds, until the child has its copies

 public:
  RootfsPlan();
  ~RootfsPlan();
  RootfsPlan(RootfsPlan&&) noexcept;
  RootfsPlan& operator=(RootfsPlan&&) noexcept;
};

// Brings up "lo" in the new network namespace: the RTM_NEWLINK request is built with libnl in
// the parent; apply() only opens a netlink socket, sends those bytes and reads the ack.
// Precondition for apply(): in the new network namespace, holding CAP_NET_ADMIN in the user
// namespace that owns it.
class LoopbackPlan {
 public:
  static LoopbackPlan prepare();
  bool apply(process::ChildFailure& failure) const noexcept;

 private:
  std::vector<std::uint8_t> request_;  // one nlmsghdr + ifinfomsg (+ attributes), NLM_F_ACK set
  std::uint32_t sequence_ = 0;
};

// Landlock beneath the mounts (defence in depth, docs/namespace-backend.md#landlock-beneath-the-
// mounts): a ruleset whose rules follow RootfsPlan::reach, so that what the sandbox could reach
// only through a mistake -- a directory fd from outside its tree, a bind or a detach gone wrong --
// stays out of reach even then. prepare() (parent) creates the ruleset, handling every filesystem
// right the kernel's ABI knows, and allows rlm-sandbox-init's binary (read and execute: the child
// execs it by fd, and Landlock checks that exec on its host path). apply() (child) adds one rule
// per reach entry at its sandbox path -- for a bind the very inode the host path has, so the rule
// covers exactly what is mounted -- then restricts itself and closes the ruleset: init and all it
// starts run in that domain, pools' and sessions' sandboxes included (it is built before init).
// Scopes: signals (in a PID namespace of its own, where every process is of the same domain and
// they only repeat what the namespace holds) and abstract unix sockets under network "none" (the
// network namespace holds that too; under "host" the policy lets them through).
// Preconditions for apply(): the root filesystem built (a Landlock domain may not mount), and
// no_new_privs set (PrivilegePlan); the ruleset fd still open.
class LandlockPlan {
 public:
  // nullopt where the kernel has no Landlock (ABI 0, or a seccomp profile refusing its calls):
  // the run goes on without it, as health says. Throws Error.
  static std::optional<LandlockPlan> prepare(const Policy& policy, const RootfsPlan& rootfs,
                                             const std::string& init_path);
  // For health's detail: whether runs get a ruleset on this host, at which ABI.
  static std::string describe_host();
  bool apply(process::ChildFailure& failure) const noexcept;
  int ruleset_fd() const { return fd_.get(); }  // >= 4, close-on-exec

  struct Rule {
    std::string path;  // in the sandbox
    unsigned long long access = 0;
    std::string step;  // "landlock rule for /usr"
  };
  const std::vector<Rule>& rules() const { return rules_; }

 private:
  LandlockPlan() = default;
  host::UniqueFd fd_;  // the ruleset
  std::vector<Rule> rules_;
};

// Privileges: the bounding set dropped except the policy's capabilities, the kept ones made
// inheritable and ambient so that they (and only they) survive exec as a non-root uid,
// securebits locked (NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE, all locked),
// and no_new_privs. Cap sets are computed with libcap in the parent; apply() uses capget/capset
// and prctl. Permitted and effective are left as they are; the exec of init recomputes them from
// the ambient set. (The seccomp filter comes later still: init's payload child installs it.)
// Preconditions for apply(): holding CAP_SETPCAP and every kept capability in the current user
// namespace; the sandbox uid/gid already set (securebits lock the uid-change rules).
class PrivilegePlan {
 public:
  static PrivilegePlan prepare(const Policy& policy);
  bool apply(process::ChildFailure& failure) const noexcept;

  // The kept capabilities as a bitmask (bit n = capability n), for tests and reports.
  std::uint64_t kept() const { return kept_; }

 private:
  std::vector<int> drop_from_bounding_;  // every capability up to cap_last_cap not kept
  std::vector<int> ambient_;             // the kept ones
  std::uint64_t kept_ = 0;
  unsigned long securebits_ = 0;
};

}  // namespace rlm::ns
