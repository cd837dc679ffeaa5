#include "seccomp_filter.hpp"

#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "rlm_init/protocol.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::init {
namespace {

std::string read_program(int fd, const char* flag, std::vector<sock_filter>& program) {
  struct stat info {};
  if (fstat(fd, &info) != 0) return std::string(flag) + ": " + std::strerror(errno);
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0 || size % sizeof(sock_filter) != 0 || size / sizeof(sock_filter) > BPF_MAXINSNS)
    return std::string(flag) + ": not a BPF program (" + std::to_string(size) + " bytes)";
  program.resize(size / sizeof(sock_filter));
  auto* bytes = reinterpret_cast<char*>(program.data());
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = pread(fd, bytes + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::string(flag) + ": short read";
    done += static_cast<std::size_t>(n);
  }
  return "";
}

long install(const std::vector<sock_filter>& program, unsigned flags) noexcept {
  sock_fprog prog{static_cast<unsigned short>(program.size()),
                  const_cast<sock_filter*>(program.data())};
  return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

}  // namespace

std::string load_filters(const Options& options, Filters& filters) {
  namespace protocol = rlm::init_protocol;
  std::string error;
  if (options.seccomp_fd >= 0) {
    error = read_program(options.seccomp_fd, protocol::kSeccompFdFlag, filters.kill);
    close(options.seccomp_fd);
  }
  if (error.empty() && options.seccomp_notify_fd >= 0) {
    error = read_program(options.seccomp_notify_fd, protocol::kSeccompNotifyFdFlag, filters.notify);
    close(options.seccomp_notify_fd);
  }
  return error;
}

int install_in_child(const Filters& filters, int socket) noexcept {
  if (filters.empty()) return 0;
  // Lets an unprivileged process install a filter, and keeps execve from gaining privileges the
  // filter's author did not plan for. The namespace backend has set it already; local has not.
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
  if (!filters.guarded.empty()) {
    if (socket < 0) return EINVAL;
    const long listener = install(filters.guarded, SECCOMP_FILTER_FLAG_NEW_LISTENER);
    return listener >= 0 ? sys::send_fd(socket, static_cast<int>(listener)) : errno;
  }
  if (!filters.notify.empty() && socket >= 0) {
    const long listener = install(filters.notify, SECCOMP_FILTER_FLAG_NEW_LISTENER);
    if (listener >= 0) return sys::send_fd(socket, static_cast<int>(listener));  // close-on-exec
    // EINVAL: no user notification here; EBUSY: an outer filter already has a listener.
    if (errno != EINVAL && errno != EBUSY) return errno;
  }
  if (filters.kill.empty()) return EINVAL;
  return install(filters.kill, 0) == 0 ? 0 : errno;
}

int receive_listener(int socket) {
  char byte = 0;
  int fd = -1;
  const sys::Received received = sys::receive_with_fds(socket, {&byte, 1}, {&fd, 1});
  // EOF: the child exec'd or exited without sending.
  return received.bytes > 0 && received.fds == 1 ? fd : -1;
}

NotifyListener::NotifyListener(int fd) : fd_(fd) {
  if (fd_ < 0) return;
  // The kernel's structs may be larger than the headers we were built with.
  seccomp_notif_sizes sizes{};
  if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) sizes = {};
  notification_.resize(std::max<std::size_t>(sizes.seccomp_notif, sizeof(seccomp_notif)));
  response_.resize(std::max<std::size_t>(sizes.seccomp_notif_resp, sizeof(seccomp_notif_resp)));
}

NotifyListener::~NotifyListener() {
  close();
}

void NotifyListener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool NotifyListener::receive(Caught& caught) {
  if (fd_ < 0) return false;
  // The kernel insists on a zeroed buffer.
  std::fill(notification_.begin(), notification_.end(), 0);
  int rc;
  while ((rc = ioctl(fd_, SECCOMP_IOCTL_NOTIF_RECV, notification_.data())) < 0 && errno == EINTR) {
  }
  if (rc < 0) return false;  // ENOENT: withdrawn, the caller died
  seccomp_notif notification{};
  std::memcpy(&notification, notification_.data(), sizeof notification);
  caught.id = notification.id;
  caught.pid = static_cast<pid_t>(notification.pid);
  caught.syscall = notification.data.nr;
  std::copy(std::begin(notification.data.args), std::end(notification.data.args), caught.args);
  return true;
}

bool NotifyListener::valid(const Caught& caught) {
  if (fd_ < 0) return false;
  std::uint64_t id = caught.id;
  return ioctl(fd_, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0;
}

bool NotifyListener::allow(const Caught& caught) {
  if (fd_ < 0) return false;
  std::fill(response_.begin(), response_.end(), 0);
  seccomp_notif_resp response{};
  response.id = caught.id;
  response.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
  std::memcpy(response_.data(), &response, sizeof response);
  if (ioctl(fd_, SECCOMP_IOCTL_NOTIF_SEND, response_.data()) == 0) return true;
  if (errno == EINVAL) deny(caught);  // no CONTINUE on this kernel: the call stays denied
  return false;
}

void NotifyListener::deny(const Caught& caught) {
  if (fd_ < 0) return;
  std::fill(response_.begin(), response_.end(), 0);
  seccomp_notif_resp response{};
  response.id = caught.id;
  response.error = -EPERM;
  std::memcpy(response_.data(), &response, sizeof response);
  ioctl(fd_, SECCOMP_IOCTL_NOTIF_SEND, response_.data());
}

}  // namespace rlm::init
