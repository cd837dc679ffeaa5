#include "namespace/probe.hpp"

#include <atomic>
#include <chrono>

#include "namespace/setup_fix.hpp"
#include "namespace/warm_sandbox.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {
namespace {

// Every namespace, network "none", a private /tmp, the default limits (so the cgroup step is
// taken), and no binds: what every isolating policy's setup does, nothing that depends on a
// policy's paths.
Policy probe_policy() {
  Policy policy;
  policy.name = "setup probe";
  Mount tmp;
  tmp.target = "/tmp";
  tmp.type = Mount::Type::tmpfs;
  tmp.readonly = false;
  policy.filesystem.mounts = {tmp};
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
    WarmSandbox::build(probe_policy(), init_path,
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
