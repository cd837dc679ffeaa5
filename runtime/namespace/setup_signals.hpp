// Cheap, exact signs that the namespace backend's setup may be refused here even though user
// namespaces are switched on: what a container does to its processes. Reading them costs a few
// small /proc reads, no clone. Where every one is clear, backend selection trusts the sysctls (the
// cold path stays cheap); where any is set, selection runs the real setup probe (probe.hpp), so
// that it agrees with `health`. The same signals word the fix of a failed step (setup_fix.hpp).
#pragma once

#include <string>
#include <string_view>

#include "host/container.hpp"

namespace rlm::ns {

struct SetupSignals {
  // A seccomp filter is installed on this process ("Seccomp: 2" in /proc/self/status), as every
  // container runtime's default profile does.
  bool seccomp_filter = false;
  // Mounts beneath /proc other than on the kernel's permanently empty directories (binfmt_misc):
  // a container's masked paths. In a new user namespace the kernel then refuses a fresh proc
  // mount (it would reveal what they hide). One of them, e.g. "/proc/kcore".
  bool masked_proc = false;
  std::string masked_example;
  // Root without a capability its setup needs (CAP_SETUID/CAP_SETGID to create the namespace as
  // the sandbox's host uid) or that every unconfined root has (CAP_SYS_ADMIN): the names.
  std::string root_missing_caps;
  // An AppArmor profile confining the runtime (/proc/self/attr/apparmor/current other than
  // "unconfined"), as Docker's docker-default, which denies mount: e.g. "docker-default (enforce)".
  std::string apparmor_profile;
  host::ContainerKind container;

  // A confirmed container (container.hpp: not /.dockerenv alone, which images built from
  // exported containers carry, this project's build machines among them).
  bool in_container() const {
    return container.kind != host::ContainerKind::none && container.confirmed;
  }
  bool any() const {
    return seccomp_filter || masked_proc || !root_missing_caps.empty() ||
           !apparmor_profile.empty() || in_container();
  }
  // "a seccomp filter on the runtime, /proc masked (/proc/kcore), in a docker container (...)"
  std::string describe() const;
};

// This process's signals, read now.
SetupSignals read_setup_signals();

// The parts read_setup_signals() derives from text, for tests: the value of "Seccomp:" and
// "CapEff:" lines of a /proc/PID/status, and mountinfo's masked /proc paths.
bool status_has_seccomp_filter(std::string_view status);
// The first mount point beneath /proc that masks something, or "" when none does.
std::string first_masked_proc_path(std::string_view mountinfo);
// For euid 0: the names of CAP_SETUID, CAP_SETGID and CAP_SYS_ADMIN missing from `status`'s CapEff.
std::string missing_root_caps(std::string_view status);

}  // namespace rlm::ns
