#include "namespace/setup_fix.hpp"

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "namespace/userns.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
namespace {

constexpr const char* kProfileInstalled = "share/rlm-sandbox/containers/rlm-sandbox-seccomp.json";
constexpr const char* kProfileSource = "packaging/containers/rlm-sandbox-seccomp.json";

bool starts_with_any(std::string_view step, std::initializer_list<std::string_view> prefixes) {
  for (const auto prefix : prefixes)
    if (step.starts_with(prefix)) return true;
  return false;
}

// Steps whose syscall a container's default seccomp profile refuses: clone/unshare with namespace
// flags, mount and umount2 (without CAP_SYS_ADMIN), pivot_root, sethostname.
bool seccomp_sensitive(std::string_view step) {
  return starts_with_any(step, {"clone", "unshare", "mount ", "bind ", "mask ", "make every mount",
                                "pivot_root", "detach ", "sethostname"});
}

bool owner_or_map_step(std::string_view step) {
  return step.find("(namespace owner)") != std::string_view::npos ||
         (step.starts_with("write /proc/") &&
          (step.ends_with("uid_map") || step.ends_with("gid_map") || step.ends_with("setgroups")));
}

std::string seccomp_fix() {
  return "run the container with rlm-sandbox's seccomp profile (Docker's default plus only the "
         "namespace setup's calls; no added capabilities and no seccomp=unconfined needed): "
         "Docker: docker run --security-opt seccomp=" +
         seccomp_profile_location() +
         "; Kubernetes: the container's securityContext.seccompProfile: {type: Localhost, "
         "localhostProfile: rlm-sandbox-seccomp.json} with that file in the kubelet's seccomp "
         "directory (docs/containers.md)";
}

std::string proc_fix() {
  return "give the container an unmasked /proc: Docker: --security-opt systempaths=unconfined; "
         "Kubernetes: securityContext.procMount: Unmasked (which needs hostUsers: false)";
}

std::string caps_fix() {
  return "keep CAP_SETUID and CAP_SETGID in the container, which a root runtime needs to give "
         "each sandbox a host uid of its own (Docker keeps them by default, else --cap-add SETUID "
         "--cap-add SETGID; Kubernetes: securityContext.capabilities.add: [SETUID, SETGID]), or "
         "run rlm-sandbox as a non-root user (docker run --user 1000; Kubernetes: runAsUser), "
         "whose sandboxes map to its own uid";
}

constexpr const char* kLandlockAlternative =
    "; or, with weaker isolation, a policy whose backend.prefer names landlock (opt-in, never "
    "chosen automatically; docs/containers.md)";

bool permission(int error) {
  return error == EPERM || error == EACCES;
}

}  // namespace

std::string seccomp_profile_location() {
  std::error_code failed;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", failed);
  if (!failed) {
    const auto installed = exe.parent_path().parent_path() / kProfileInstalled;
    if (std::filesystem::is_regular_file(installed, failed)) return installed.string();
  }
  return std::string("PREFIX/") + kProfileInstalled + " (installed under rlm-sandbox's prefix; " +
         kProfileSource + " in its source)";
}

SetupDiagnosis diagnose_setup_step(std::string_view step, int error, const SetupSignals& signals) {
  SetupDiagnosis d;
  const bool contained = signals.any();
  if (step == "mount proc on /proc" && permission(error) && signals.masked_proc) {
    d.cause =
        "the kernel refuses a new proc mount in a user namespace while the runtime's /proc "
        "has masked paths (" +
        signals.masked_example + ", ...), as a container's has";
    d.fix = proc_fix();
  } else if (seccomp_sensitive(step) && permission(error) && signals.seccomp_filter) {
    d.cause =
        "refused by the seccomp filter on the runtime (Seccomp: 2 in /proc/self/status), as "
        "Docker's and containerd's default profiles refuse namespaces, mount, pivot_root";
    d.fix = seccomp_fix();
    if (signals.masked_proc) d.fix += "; and " + proc_fix() + ", or the proc mount fails next";
  } else if (seccomp_sensitive(step) && permission(error) && !signals.apparmor_profile.empty()) {
    d.cause = "refused by the AppArmor profile " + signals.apparmor_profile +
              " confining the runtime (Docker's docker-default denies mount)";
    d.fix =
        "run the container under an AppArmor profile that allows mount: Docker: "
        "--security-opt apparmor=unconfined; Kubernetes: securityContext.appArmorProfile: "
        "{type: Unconfined}";
    if (signals.masked_proc) d.fix += "; and " + proc_fix();
  } else if (step.starts_with("clone")) {
    // No seccomp filter: the host's switches for user namespaces.
    d.cause = error == ENOSPC ? "the user namespace limit is reached or zero"
                              : "user namespaces are not available to this process";
    d.fix = user_namespace_fix();
  } else if (owner_or_map_step(step) && permission(error)) {
    d.cause = signals.root_missing_caps.empty()
                  ? "the runtime may not give the namespace its ids"
                  : "the runtime is root without " + signals.root_missing_caps;
    d.fix = caps_fix();
  } else {
    return d;
  }
  if (contained) d.fix += kLandlockAlternative;
  return d;
}

SetupError::SetupError(std::string step, int error)
    : SetupError(step, error, diagnose_setup_step(step, error, read_setup_signals())) {}

namespace {

std::string summarize(const std::string& step, int error, const SetupDiagnosis& diagnosis) {
  return "sandbox setup failed: " + step + ": " + sys::errno_text(error) +
         (diagnosis.cause.empty() ? "" : " (" + diagnosis.cause + ")");
}

}  // namespace

SetupError::SetupError(std::string step, int error, SetupDiagnosis diagnosis)
    : Error(summarize(step, error, diagnosis) +
            (diagnosis.fix.empty() ? "" : "; to fix: " + diagnosis.fix)),
      summary_(summarize(step, error, diagnosis)),
      step_(std::move(step)),
      error_(error),
      diagnosis_(std::move(diagnosis)) {}

}  // namespace rlm::ns
