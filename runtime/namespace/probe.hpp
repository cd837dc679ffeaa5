// The honest probe behind `health` and backend selection: builds a throw-away sandbox through the
// real setup pipeline (built_sandbox.cpp: the sandbox uid, the cgroup step, clone into every
// namespace, the id maps, then in the child the root tmpfs, pivot_root, the proc mount, /dev, /tmp,
// the hostname, loopback, privileges, and rlm-sandbox-init's exec), and destroys it. So "available"
// means a run's setup works here, not that a user namespace could be cloned. A failing step is
// reported with its errno and the setting that fixes it (setup_fix.hpp).
#pragma once

#include <optional>
#include <string>

namespace rlm::ns {

struct ProbeFailure {
  std::string detail;  // "sandbox setup failed: pivot_root into the root tmpfs: ... (cause)"
  std::string fix;     // "" when nothing known applies
  std::string step;    // the failing step ("" when the failure was not a setup step's)
  int error = 0;
};

// Nothing when a sandbox could be built with `init_path` as its init. A success is remembered for
// the process's life (a host that could build a sandbox once keeps that ability); a failure is
// probed again on the next call. Costs one sandbox build (milliseconds), so the cold path asks for
// it only where setup_signals.hpp says a container may refuse the setup.
std::optional<ProbeFailure> probe_setup(const std::string& init_path);

}  // namespace rlm::ns
