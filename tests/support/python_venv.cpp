#include "support/python_venv.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <stdexcept>

namespace rlm::test {

PythonVenv::PythonVenv() {
  // Sandboxes run as other users: the directory must be theirs to read (mkdtemp makes it 0700).
  if (::chmod(dir_.path().c_str(), 0755) != 0) throw std::runtime_error("chmod failed");
  const auto made = run_process({"/usr/bin/python3", "-m", "venv", "--without-pip", path()});
  if (made.exit_code != 0) throw std::runtime_error("/usr/bin/python3 -m venv failed: " + made.err);
  const auto version = run_process(
      {"/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2], end='')"});
  site_ = path() + "/lib/python" + version.out + "/site-packages";
  std::filesystem::create_directories(site_ + "/" + kModule);
  std::filesystem::create_directories(plain_site() + "/rlm_site_probe");
  dir_.write("venv/lib/python" + version.out + "/site-packages/" + kModule + "/__init__.py",
             "VALUE = " + std::to_string(kValue) + "\n");
  dir_.write("site/rlm_site_probe/__init__.py", "WHERE = 'plain site'\n");
}

}  // namespace rlm::test
