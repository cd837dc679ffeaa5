#include "netns/netlink_request.hpp"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace rlm::netns {

int send_netlink_request(const std::uint8_t* bytes, std::size_t size, std::uint32_t sequence,
                         const char* step, process::ChildFailure& failure) noexcept {
  auto fail = [&](int error) {
    failure.set(step, error);
    return error;
  };
  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return fail(errno);
  auto close_and_fail = [&](int error) {
    ::close(fd);
    return fail(error);
  };

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = ::sendto(fd, bytes, size, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(size)) return close_and_fail(sent < 0 ? errno : EIO);

  // The ack (an NLMSG_ERROR carrying 0 or -errno, plus the echoed request) fits easily.
  alignas(nlmsghdr) char buffer[8192];
  for (;;) {
    const ssize_t received = ::recv(fd, buffer, sizeof buffer, 0);
    if (received < 0 && errno == EINTR) continue;
    if (received <= 0) return close_and_fail(received < 0 ? errno : EIO);
    int left = static_cast<int>(received);
    for (auto* header = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(header, left);
         header = NLMSG_NEXT(header, left)) {
      if (header->nlmsg_seq != sequence || header->nlmsg_type != NLMSG_ERROR) continue;
      if (header->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return close_and_fail(EPROTO);
      const int error = -static_cast<const nlmsgerr*>(NLMSG_DATA(header))->error;
      ::close(fd);
      return error;
    }
  }
}

}  // namespace rlm::netns
