#include "host/context_fd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::host {

UniqueFd open_context_fd(const std::string& file, const std::string& data) {
  if (!file.empty()) {
    UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!fd) throw Error("cannot open the context file '" + file + "': " + sys::errno_text(errno));
    return fd;
  }
  UniqueFd fd(memfd_create("rlm-sandbox-context", MFD_CLOEXEC));
  if (!fd) throw Error("memfd_create: " + sys::errno_text(errno));
  for (std::size_t written = 0; written < data.size();) {
    const ssize_t count = write(fd.get(), data.data() + written, data.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw Error("writing the context: " + sys::errno_text(errno));
    written += static_cast<std::size_t>(count);
  }
  if (lseek(fd.get(), 0, SEEK_SET) != 0) throw Error("lseek: " + sys::errno_text(errno));
  return fd;
}

}  // namespace rlm::host
