// The policy's "python" section on this host: each directory it names checked (a real directory,
// not a kernel interface, changeable by nobody but root and the runtime's own user, not writable
// through another of the policy's mounts) and, for a venv, its site-packages found. Checked when a
// policy is loaded (every problem at its JSON path) and again when a backend prepares a sandbox
// (the host may have changed in between). docs/policy.md, "python".
#pragma once

#include <string>
#include <vector>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::policy {

// The payload's variable that lists the site directories, colon-separated, in order.
inline constexpr const char* kSiteDirsVariable = "RLM_SANDBOX_SITE_DIRS";

struct PythonDir {
  std::string where;  // its JSON path: "python.venv", "python.site_packages[1]"
  std::string path;   // the directory: its host path and its path inside the sandbox
  std::string site;   // what goes on sys.path: a venv's lib/pythonX.Y/site-packages, else `path`
  // A read-only bind of the policy's own already puts the directory at its place.
  bool bound_by_policy = false;
};

// Every directory of `policy.python`, venv first, with every problem appended to `problems` (the
// list is meaningful only when none was).
std::vector<PythonDir> check_python(const Policy& policy, std::vector<Diagnostic>& problems);

// For a backend: the directories to expose, in the policy's order (venv first). Throws Error
// naming every problem.
std::vector<PythonDir> python_dirs(const Policy& policy);

// The value of RLM_SANDBOX_SITE_DIRS for `dirs`: their site directories joined by ':'.
std::string site_dirs_value(const std::vector<PythonDir>& dirs);

}  // namespace rlm::policy
