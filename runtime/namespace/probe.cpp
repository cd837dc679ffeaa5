#include "namespace/probe.hpp"

#include <atomic>
#include <chrono>

#include "namespace/built_sandbox.hpp"
#include "namespace/setup_fix.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {
namespace {

// Every namespace, network "none", a private /tmp, the default limits (so the cgroup step is
// taken), and only the system's library directories bound read-only (optional, as in the
// default policy): a dynamically linked rlm-sandbox-init (the sanitizer build's) needs its
// interpreter and libraries to exec. Nothing that depends on a policy's own paths.
Policy probe_policy() {
  Policy policy;
  policy.name = "setup probe";
  for (const char* dir : {"/usr", "/lib", "/lib64"}) {
    Mount bind;
    bind.source = bind.target = dir;
    bind.readonly = true;
    bind.optional = true;
    policy.filesystem.mounts.push_back(bind);
  }
  Mount tmp;
  tmp.target = "/tmp";
  tmp.type = Mount::Type::tmpfs;
  tmp.readonly = false;
  policy.filesystem.mounts.push_back(tmp);
  policy.filesystem.workdir = "/tmp";
  return policy;
}

constexpr std::chrono::seconds kProbeDeadline{10};

}  // namespace

std::optional<ProbeFailure> probe_setup(const std::string& init_path) {
  static std::atomic<bool> worked{false};
  if (worked.load()) return std::nullopt;
  try {
    // Destroyed at once: init is killed, the cgroup removed, the sandbox uid freed.
    BuiltSandbox::build(probe_policy(), init_path,
                        std::chrono::steady_clock::now() + kProbeDeadline);
  } catch (const SetupError& error) {
    return ProbeFailure{error.summary(), error.diagnosis().fix, error.step(), error.error()};
  } catch (const std::exception& error) {
    return ProbeFailure{error.what(), "", "", 0};
  }
  worked.store(true);
  return std::nullopt;
}

}  // namespace rlm::ns
