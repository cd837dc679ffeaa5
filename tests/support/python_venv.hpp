// A real virtual environment for the tests of the policy's "python" section: made by the host's
// /usr/bin/python3 -m venv (without pip: there is no PyPI here), with a package written by hand
// into its site-packages, in a fresh directory under /tmp that sandboxes may read. Removed with
// everything in it on destruction.
#pragma once

#include <chrono>
#include <string>

#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {

class PythonVenv {
 public:
  // The package's name and what `import rlm_venv_probe; rlm_venv_probe.VALUE` gives.
  static constexpr const char* kModule = "rlm_venv_probe";
  static constexpr int kValue = 4242;

  // Throws std::runtime_error when the venv cannot be made (no /usr/bin/python3 or its venv).
  PythonVenv();

  const std::string& root() const { return dir_.path(); }  // the directory that holds the venv
  std::string path() const { return dir_.path() + "/venv"; }
  const std::string& site() const { return site_; }  // lib/pythonX.Y/site-packages
  // A directory beside the venv with a module of its own ("rlm_site_probe"), for site_packages.
  std::string plain_site() const { return dir_.path() + "/site"; }

  // The policy a test of `backend` runs with: python-repl (trusted-local for "local") exposing
  // the venv and the plain site directory, with 20 s of wall time.
  Policy policy_for(const std::string& backend) const {
    Policy policy = load_policy(backend == "local" ? "trusted-local" : "python-repl");
    policy.limits.wall_time = std::chrono::seconds(20);
    policy.python.venv = path();
    policy.python.site_packages = {plain_site()};
    return policy;
  }

 private:
  TempDir dir_;
  std::string site_;
};

}  // namespace rlm::test
