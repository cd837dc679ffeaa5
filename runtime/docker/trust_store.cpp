#include "docker/trust_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::docker {
namespace {

constexpr const char* kTrustFileName = "ca-certificates.crt";

bool is_run_id(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '-';
  });
}

std::string directory_of(const std::string& run_id) {
  return "/tmp/rlm-sandbox-trust-" + run_id;
}

}  // namespace

TrustFile::TrustFile(const std::string& run_id, const std::string& contents) : run_id_(run_id) {
  if (!is_run_id(run_id)) throw Error("network.inject: not a run id: " + run_id);
  const std::string directory = directory_of(run_id);
  if (mkdir(directory.c_str(), 0700) != 0)
    throw Error("network.inject: cannot make " + directory +
                " for the sandbox's trust store: " + sys::errno_text(errno));
  path_ = directory + "/" + kTrustFileName;
  host::UniqueFd file(
      open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444));
  bool written = static_cast<bool>(file);
  for (std::size_t done = 0; written && done < contents.size();) {
    const ssize_t wrote = write(file.get(), contents.data() + done, contents.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    written = wrote > 0;
    if (written) done += static_cast<std::size_t>(wrote);
  }
  if (!written) {
    const int error = errno;
    remove_trust_directory(run_id);
    throw Error("network.inject: cannot write the sandbox's trust store " + path_ + ": " +
                sys::errno_text(error));
  }
}

TrustFile::~TrustFile() {
  remove_trust_directory(run_id_);
}

void remove_trust_directory(const std::string& run_id) noexcept {
  try {
    if (!is_run_id(run_id)) return;
    const std::string directory = directory_of(run_id);
    host::UniqueFd fd(open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat info {};
    if (!fd || fstat(fd.get(), &info) != 0 || info.st_uid != geteuid()) return;
    unlinkat(fd.get(), kTrustFileName, 0);
    rmdir(directory.c_str());
  } catch (...) {
  }
}

}  // namespace rlm::docker
