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
#include "netns/netlink_request.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

using netns::send_netlink_request;

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

}  // namespace rlm::ns
