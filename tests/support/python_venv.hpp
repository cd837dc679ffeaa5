// A real virtual environment for the tests of the policy's "python" section: made by the host's
// /usr/bin/python3 -m venv (without pip: there is no PyPI here), with a package written by hand
// into its site-packages, in a fresh directory under /tmp that sandboxes may read. Removed with
// everything in it on destruction.
#pragma once

#include <string>

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

 private:
  TempDir dir_;
  std::string site_;
};

}  // namespace rlm::test
