// A setup step of the namespace sandbox that failed, said with its cause and the setting that
// fixes it -- for Docker and for Kubernetes (securityContext) where the signals (setup_signals.hpp)
// show a container's doing: its seccomp profile, its masked /proc, its dropped capabilities.
// Every setup failure of a run, and the probe behind `health` and selection (probe.hpp), is a
// SetupError, so both name the same fix.
#pragma once

#include <string>
#include <string_view>

#include "namespace/setup_signals.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

struct SetupDiagnosis {
  std::string cause;  // e.g. "refused by the seccomp filter on the runtime"; "" when unknown
  std::string fix;    // "" when nothing known applies
};

// Pure: the step's name as a ChildFailure or the parent names it ("clone of the sandbox's
// namespaces", "mount proc on /proc", "pivot_root into the root tmpfs", "write /proc/N/uid_map",
// ...), errno, and the signals.
SetupDiagnosis diagnose_setup_step(std::string_view step, int error, const SetupSignals& signals);

// The path the shipped seccomp profile has here: installed beside this binary's prefix
// (share/rlm-sandbox/containers/rlm-sandbox-seccomp.json) when it exists, else the generic words.
std::string seccomp_profile_location();

// Parent side. what(): "sandbox setup failed: <step>: <errno text>" and, when diagnosed,
// " (<cause>); to fix: <fix>".
class SetupError : public Error {
 public:
  // Reads this process's signals (setup_signals.hpp) to diagnose the step.
  SetupError(std::string step, int error);
  const std::string& step() const { return step_; }
  int error() const { return error_; }
  const SetupDiagnosis& diagnosis() const { return diagnosis_; }
  // what() without the fix: "sandbox setup failed: <step>: <errno text> (<cause>)".
  const std::string& summary() const { return summary_; }

 private:
  SetupError(std::string step, int error, SetupDiagnosis diagnosis);
  std::string summary_;
  std::string step_;
  int error_;
  SetupDiagnosis diagnosis_;
};

}  // namespace rlm::ns
