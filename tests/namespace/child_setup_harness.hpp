// Runs the child setup steps for real, in the context the namespace backend gives them: a child
// in new user/mount/PID/net/UTS/IPC namespaces whose uid/gid maps the parent wrote (sandbox ids
// -> 65534 on the host, as when the runtime runs as root), which has switched to the sandbox
// ids while keeping every capability of its user namespace, and is PID 1 of its PID namespace.
// It applies the plans in the backend's order, then execs a checker whose output is returned.
#pragma once

#include <string>
#include <vector>

#include "namespace/child_setup.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::ns::test {

struct Steps {
  bool rootfs = true;
  bool loopback = true;
  bool privileges = true;
  // When >= 0, the checker is started as the backend starts rlm-sandbox-init: execveat(exec_fd,
  // "", argv, envp, AT_EMPTY_PATH) on a descriptor opened on the host before the namespaces.
  int exec_fd = -1;
};

struct SandboxRun {
  int exit_code = -1;  // the checker's, 125 when a step failed, 127 when exec failed
  int signal = 0;
  std::string out;  // the checker's stdout
  std::string err;  // its stderr; a failed step is reported here as "step failed: STEP: errno N"
};

// Prepares the plans from `policy` (in this process), runs them in a fresh sandbox and execs
// argv[0] (a path inside the sandbox) with a small fixed environment.
SandboxRun run_in_sandbox(const Policy& policy, const std::vector<std::string>& argv,
                          Steps steps = {});
// run_in_sandbox(policy, {"/bin/sh", "-c", script}).
SandboxRun run_script(const Policy& policy, const std::string& script, Steps steps = {});

// The shipped default policy with a 1 MiB tmpfs cap and the probe helper bound at /probe.
Policy test_policy();

// The probe helper (static binary) in the build tree.
std::string probe_path();

// The lines of `text` containing `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

// Mount options (the sixth field) of the mountinfo line whose mount point is `point`; "" when
// nothing is mounted there.
std::string mount_options(const std::string& mountinfo, const std::string& point);

}  // namespace rlm::ns::test
