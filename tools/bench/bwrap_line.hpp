// The bubblewrap command every benchmark compares against: the same sandbox shape as the default
// policy's (every namespace unshared, /usr read-only, /proc, /dev, a private /tmp), running
// /bin/true. One copy, so every figure's baseline is the same command.
#pragma once

#include <string>
#include <vector>

namespace rlm::bench {

// The same sandbox running `payload` (argv) instead of /bin/true.
inline std::vector<std::string> bwrap_line(const std::string& bwrap,
                                           const std::vector<std::string>& payload) {
  std::vector<std::string> line = {bwrap,       "--unshare-all", "--die-with-parent",
                                   "--ro-bind", "/usr",          "/usr",
                                   "--symlink", "usr/lib",       "/lib",
                                   "--symlink", "usr/lib64",     "/lib64",
                                   "--symlink", "usr/bin",       "/bin",
                                   "--proc",    "/proc",         "--dev",
                                   "/dev",      "--tmpfs",       "/tmp"};
  line.insert(line.end(), payload.begin(), payload.end());
  return line;
}

inline std::vector<std::string> bwrap_true(const std::string& bwrap) {
  return bwrap_line(bwrap, {"/bin/true"});
}

}  // namespace rlm::bench
