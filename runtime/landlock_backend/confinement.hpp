// What confines a landlock-backend run, prepared in the parent and applied in the child between
// fork and the exec of rlm-sandbox-init: a host uid of its own (root runtime), no capabilities,
// no_new_privs, the Landlock ruleset built from the policy's mounts, and the backend's seccomp
// additions (the policy's own filter comes later, from init, stacked on them).
//
// The payload sees the host's filesystem through Landlock rights, not a root of its own: bind
// sources are granted at their host paths (a target elsewhere is not remapped), and each tmpfs
// mount is a fresh per-run host directory (0700, the sandbox uid's, removed after the run) that the
// run's TMPDIR, HOME and workdir point at when the policy names the tmpfs's target for them.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "host/sandbox_uid.hpp"
#include "landlock/landlock.hpp"
#include "process/child_failure.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::landlock_backend {

class Confinement {
 public:
  // Parent: takes a sandbox uid when the runtime is root, makes the run's directories, builds the
  // ruleset and the seccomp additions. `init_path` is granted read and execute. What the payload
  // writes through read-write binds becomes `bind_owner`'s after the run. Throws rlm::Error.
  static Confinement prepare(const Policy& policy, const std::string& init_path,
                             const HostIds& bind_owner = caller_ids());

  Confinement(Confinement&&) = default;
  Confinement& operator=(Confinement&&) = delete;
  Confinement(const Confinement&) = delete;
  // Removes the tmpfs stand-ins and gives what the sandbox uid made in the read-write binds to
  // their owner (owned_files.hpp); a uid that may still own something there is never handed out
  // again by this process. Call once nothing of the sandbox runs any more.
  ~Confinement();

  // Child: every step above; false with `failure` naming the failing step and its errno. Raw
  // syscalls only (async-signal-safe).
  bool apply_in_child(process::ChildFailure& failure) const noexcept;

  // A path as the payload should use it: a tmpfs target (or below it) becomes its run directory;
  // anything else is the host path itself.
  std::string payload_path(const std::string& policy_path) const;
  // The run directory standing in for /tmp (or the first tmpfs), "" when the policy has none.
  const std::string& tmp_dir() const { return tmp_dir_; }

  bool own_uid() const { return slot_.held(); }
  uid_t uid() const { return uid_; }

 private:
  Confinement() = default;

  host::SandboxUid slot_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  landlock::Ruleset ruleset_;
  std::vector<sock_filter> seccomp_;
  struct TmpfsDir {
    std::string target, host;
  };
  std::vector<TmpfsDir> tmpfs_;  // each removed with its contents
  std::string tmp_dir_;
  std::vector<std::string> writable_;  // the read-write binds' host paths
  HostIds bind_owner_;
};

}  // namespace rlm::landlock_backend
