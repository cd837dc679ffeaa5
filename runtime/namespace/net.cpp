// LoopbackPlan: brings "lo" up in the sandbox's network namespace. The request is built with
// libnl-route in the parent; the child only sends the bytes and reads the kernel's ack.
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netlink/errno.h>
#include <netlink/msg.h>
#include <netlink/route/link.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "namespace/child_setup.hpp"
#include "namespace/netlink_request.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

namespace {

// A fresh network namespace always gives its loopback device index 1.
constexpr int kLoopbackIndex = 1;
constexpr std::uint32_t kSequence = 1;

struct LinkDeleter {
  void operator()(rtnl_link* link) const { rtnl_link_put(link); }
};
struct MessageDeleter {
  void operator()(nl_msg* message) const { nlmsg_free(message); }
};

}  // namespace

LoopbackPlan LoopbackPlan::prepare() {
  std::unique_ptr<rtnl_link, LinkDeleter> current(rtnl_link_alloc()), change(rtnl_link_alloc());
  if (!current || !change) throw Error("cannot allocate a libnl link object");
  rtnl_link_set_ifindex(current.get(), kLoopbackIndex);
  rtnl_link_set_flags(change.get(), IFF_UP);  // ifi_change = IFF_UP: touch no other flag

  nl_msg* raw = nullptr;
  if (const int error = rtnl_link_build_change_request(current.get(), change.get(), 0, &raw);
      error < 0)
    throw Error(std::string("cannot build the netlink request that brings up lo: ") +
                nl_geterror(error));
  std::unique_ptr<nl_msg, MessageDeleter> message(raw);
  nlmsghdr* header = nlmsg_hdr(message.get());
  header->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;  // the ack is how apply() learns the outcome
  header->nlmsg_seq = kSequence;
  header->nlmsg_pid = 0;  // the kernel fills in the socket's port id

  LoopbackPlan plan;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(header);
  plan.request_.assign(bytes, bytes + header->nlmsg_len);
  plan.sequence_ = kSequence;
  return plan;
}

bool LoopbackPlan::apply(process::ChildFailure& failure) const noexcept {
  const int error = send_netlink_request(request_.data(), request_.size(), sequence_,
                                         "send the netlink request that brings up lo", failure);
  if (error == 0) return true;
  if (!failure.failed()) failure.set("bring up lo", error);
  return false;
}

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

}  // namespace rlm::ns
