#include "policy/beneath.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace rlm::policy {

host::UniqueFd open_beneath(int dir, const std::string& relative, int flags) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  // EAGAIN: a rename elsewhere raced a ".." lookup; the kernel asks for a retry, a few suffice.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const long fd = ::syscall(SYS_openat2, dir, relative.c_str(), &how, sizeof how);
    if (fd >= 0) return host::UniqueFd(static_cast<int>(fd));
    if (errno != EINTR && errno != EAGAIN) break;
  }
  return {};
}

}  // namespace rlm::policy
