// A docker run's trust store for injected credentials (docs/network.md, "Credentials"): the
// payload's container cannot be written into (its root is read-only), so the PEM bundle is a host
// file the container binds read-only at kInjectionTrustBundle. It lives in a directory of the
// run's own, root's (0700; the file 0444), named by the run's id, removed when the run ends -- or,
// after a crash, when the run's containers are collected (container_control.hpp).
#pragma once

#include <string>

namespace rlm::docker {

// `contents` as run `run_id`'s trust file, in its directory, both removed when this goes.
class TrustFile {
 public:
  // Throws Error naming network.inject when it cannot be made (an existing directory is refused).
  TrustFile(const std::string& run_id, const std::string& contents);
  ~TrustFile();
  TrustFile(const TrustFile&) = delete;
  TrustFile& operator=(const TrustFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string run_id_, path_;
};

// Removes run `run_id`'s directory and file, if they are this user's and not links; nothing for
// an id that is not a run id (digits and dashes), so no label can steer it elsewhere.
void remove_trust_directory(const std::string& run_id) noexcept;

}  // namespace rlm::docker
