#include "netns/egress_capture.hpp"

#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <netlink/msg.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "netns/netlink_request.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::netns {
namespace {

constexpr int kLoopbackIndex = 1;  // a fresh network namespace's lo
constexpr std::uint32_t kRouteSequence = 2, kLinkSequence = 3;
// Linux 6.3's IFLA_GSO_IPV4_MAX_SIZE (Debian 12's headers predate it).
constexpr int kIflaGsoIpv4MaxSize = 63;
// lo's largest segment handed through the stack at once (BIG TCP): a quarter of the packets for
// the same bytes between the sandbox and the host side's relay, whose per-packet work is most
// of its cost (tools/bench/egress_bench.cpp). At most lo's tso_max_size (512 KiB less 8).
constexpr std::uint32_t kLoopbackSegmentBytes = 256 << 10;
constexpr std::uint16_t kDnsPort = 53;
constexpr int kBacklog = 128;
// The TCP listeners and the UDP one, in one SCM_RIGHTS message (the kernel takes 253 at most).
constexpr std::size_t kMaxFds = EgressCapturePlan::kMaxPorts + 1;
static_assert(kMaxFds <= 253);

struct MessageDeleter {
  void operator()(nl_msg* message) const { nlmsg_free(message); }
};

// The bytes of a built request, numbered `sequence`, for the child to send as they are.
std::vector<std::uint8_t> request_bytes(nl_msg* message, std::uint32_t sequence) {
  nlmsghdr* header = nlmsg_hdr(message);
  header->nlmsg_seq = sequence;
  header->nlmsg_pid = 0;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(header);
  return {bytes, bytes + header->nlmsg_len};
}

// RTM_NEWROUTE: `local <any>/0 dev lo table local` -- every destination of `family` is this host.
std::vector<std::uint8_t> local_default_route(int family) {
  std::unique_ptr<nl_msg, MessageDeleter> message(
      nlmsg_alloc_simple(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL));
  if (!message) throw Error("cannot allocate a netlink message");
  rtmsg route{};
  route.rtm_family = static_cast<unsigned char>(family);
  route.rtm_dst_len = 0;
  route.rtm_table = RT_TABLE_LOCAL;
  route.rtm_protocol = RTPROT_BOOT;
  route.rtm_scope = RT_SCOPE_HOST;
  route.rtm_type = RTN_LOCAL;
  if (nlmsg_append(message.get(), &route, sizeof route, NLMSG_ALIGNTO) < 0 ||
      nla_put_u32(message.get(), RTA_OIF, kLoopbackIndex) < 0)
    throw Error("cannot build the netlink request for the egress route");
  return request_bytes(message.get(), kRouteSequence);
}

// RTM_NEWLINK: lo's GSO size for IPv6 and IPv4 raised to kLoopbackSegmentBytes. A kernel before
// 5.19 refuses it (the request is only an optimisation); one before 6.3 ignores the IPv4 one.
std::vector<std::uint8_t> loopback_segment_size() {
  std::unique_ptr<nl_msg, MessageDeleter> message(
      nlmsg_alloc_simple(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK));
  if (!message) throw Error("cannot allocate a netlink message");
  ifinfomsg link{};
  link.ifi_family = AF_UNSPEC;
  link.ifi_index = kLoopbackIndex;
  if (nlmsg_append(message.get(), &link, sizeof link, NLMSG_ALIGNTO) < 0 ||
      nla_put_u32(message.get(), IFLA_GSO_MAX_SIZE, kLoopbackSegmentBytes) < 0 ||
      nla_put_u32(message.get(), kIflaGsoIpv4MaxSize, kLoopbackSegmentBytes) < 0)
    throw Error("cannot build the netlink request for lo's segment size");
  return request_bytes(message.get(), kLinkSequence);
}

// A listener on every address of the namespace at `port`: dual-stack where the kernel has IPv6.
int listen_any(bool ipv6, int type, std::uint16_t port) noexcept {
  const int fd = ::socket(ipv6 ? AF_INET6 : AF_INET, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int ok;
  if (ipv6) {
    const int both = 0;
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_port = htons(port);
    ok = ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &both, sizeof both) == 0 &&
         ::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0;
  } else {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_port = htons(port);
    ok = ::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0;
  }
  if (ok && type == SOCK_STREAM) ok = ::listen(fd, kBacklog) == 0;
  if (!ok) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

void close_all(const int* fds, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) ::close(fds[i]);
}

std::uint16_t bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6&>(address).sin6_port);
  return 0;
}

int socket_option(int fd, int option) {
  int value = -1;
  socklen_t length = sizeof value;
  if (getsockopt(fd, SOL_SOCKET, option, &value, &length) != 0) return -1;
  return value;
}

}  // namespace

std::string capability_problem(const Policy& policy, bool own_user_namespace) {
  if (own_user_namespace) return "";
  for (const auto& capability : policy.capabilities)
    if (capability == "CAP_NET_ADMIN" || capability == "CAP_SYS_ADMIN")
      return "network: an allowlist does not hold for a sandbox with " + capability +
             " over namespaces of the host's user namespace (it could take the routes down or "
             "move a network device into the host's network); to fix: drop it from "
             "\"capabilities\", or keep a user namespace (namespaces.user; on docker, a daemon "
             "with userns-remap)";
  return "";
}

EgressCapturePlan EgressCapturePlan::prepare(const Egress& egress) {
  std::set<std::uint16_t> ports{kDnsPort};
  for (const auto& rule : egress.allow) {
    if (static_cast<std::size_t>(rule.last_port - rule.first_port) >= kMaxPorts ||
        rule.first_port == 0)
      throw Error("network.allow: \"" + rule.text + "\" spans more than " +
                  std::to_string(kMaxPorts) +
                  " ports, and the sandbox gets one listener per allowed port; to fix: list the "
                  "ports it needs");
    for (unsigned port = rule.first_port; port <= rule.last_port; ++port)
      ports.insert(static_cast<std::uint16_t>(port));
    if (ports.size() > kMaxPorts)
      throw Error("network.allow: the entries allow more than " + std::to_string(kMaxPorts) +
                  " distinct ports, and the sandbox gets one listener per allowed port; to fix: "
                  "list the ports it needs");
  }
  EgressCapturePlan plan;
  plan.ports_.assign(ports.begin(), ports.end());
  plan.route_v4_ = local_default_route(AF_INET);
  plan.route_v6_ = local_default_route(AF_INET6);
  plan.loopback_segment_ = loopback_segment_size();
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0)
    throw Error("cannot make the egress listeners' socketpair: " + sys::errno_text(errno));
  plan.host_end_ = host::UniqueFd(ends[0]);
  plan.child_end_ = host::UniqueFd(ends[1]);
  return plan;
}

bool EgressCapturePlan::apply(process::ChildFailure& failure) const noexcept {
  return apply_through(child_end_.get(), failure);
}

bool EgressCapturePlan::apply_through(int child_end,
                                      process::ChildFailure& failure) const noexcept {
  const char* v4_step = "egress: route every IPv4 destination to lo";
  int error =
      send_netlink_request(route_v4_.data(), route_v4_.size(), kRouteSequence, v4_step, failure);
  if (error != 0) {
    if (!failure.failed()) failure.set(v4_step, error);
    return false;
  }
  const char* v6_step = "egress: route every IPv6 destination to lo";
  error =
      send_netlink_request(route_v6_.data(), route_v6_.size(), kRouteSequence, v6_step, failure);
  // A kernel without IPv6, or a namespace with IPv6 disabled on lo (EACCES: Docker's), leaves the
  // sandbox none: nothing to route, and IPv4 listeners.
  bool ipv6 = error == 0;
  if (error != 0 &&
      (failure.failed() || (error != EAFNOSUPPORT && error != EOPNOTSUPP && error != EACCES))) {
    if (!failure.failed()) failure.set(v6_step, error);
    return false;
  }

  const char* segment_step = "egress: raise lo's segment size";
  send_netlink_request(loopback_segment_.data(), loopback_segment_.size(), kLinkSequence,
                       segment_step, failure);
  if (failure.failed()) return false;  // the socket failed, not the kernel's refusal

  int fds[kMaxFds];
  std::size_t count = 0;
  auto fail = [&](const char* step) {
    failure.set(step, errno);
    close_all(fds, count);
    return false;
  };
  for (const std::uint16_t port : ports_) {
    const int fd = listen_any(ipv6, SOCK_STREAM, port);
    if (fd < 0) return fail("egress: listen on an allowed port");
    fds[count++] = fd;
  }
  const int dns = listen_any(ipv6, SOCK_DGRAM, kDnsPort);
  if (dns < 0) return fail("egress: bind the DNS socket");
  fds[count++] = dns;

  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  char tag = 'E';
  iovec data{&tag, 1};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = CMSG_SPACE(count * sizeof(int));
  cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(rights), fds, count * sizeof(int));
  ssize_t sent;
  do {
    sent = ::sendmsg(child_end, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != 1) return fail("egress: hand the listeners to the host");
  close_all(fds, count);  // the host has them; nothing of ours listens in here
  ::close(child_end);
  return true;
}

std::vector<host::UniqueFd> EgressCapturePlan::capture_in(
    int netns_fd, std::chrono::steady_clock::time_point deadline) {
  // The thread's own copy of the child's end: apply closes it, the plan's goes below.
  const int child_end = fcntl(child_end_.get(), F_DUPFD_CLOEXEC, 0);
  if (child_end < 0)
    throw Error("egress: cannot copy the listeners' socket: " + sys::errno_text(errno));
  process::ChildFailure failure;
  std::thread joiner([&] {
    if (setns(netns_fd, CLONE_NEWNET) != 0) {
      failure.set("egress: join the container's network namespace (setns)", errno);
      ::close(child_end);
      return;
    }
    if (!apply_through(child_end, failure)) ::close(child_end);  // closed when it succeeds
  });
  joiner.join();
  close_child_end();
  if (failure.failed())
    throw Error(std::string(failure.step) + ": " + sys::errno_text(failure.error));
  return receive(deadline);
}

std::vector<host::UniqueFd> EgressCapturePlan::receive(
    std::chrono::steady_clock::time_point deadline) {
  pollfd ready{host_end_.get(), POLLIN, 0};
  int polled;
  while ((polled = poll(&ready, 1, sys::poll_timeout_ms(deadline))) < 0 && errno == EINTR) {
  }
  if (polled == 0) throw Error("egress: the sandbox did not hand over its listeners in time");
  if (polled < 0) throw Error("egress: waiting for the listeners: " + sys::errno_text(errno));

  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  char tag = 0;
  iovec data{&tag, 1};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  ssize_t got;
  while ((got = recvmsg(host_end_.get(), &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 &&
         errno == EINTR) {
  }
  std::vector<host::UniqueFd> fds;  // owns whatever arrived, even on the way out by a throw
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header))
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
      const std::size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
        fds.emplace_back(fd);
      }
    }
  host_end_.reset();
  if (got <= 0)
    throw Error("egress: the sandbox's setup ended before it handed over its listeners");
  if ((message.msg_flags & MSG_CTRUNC) || tag != 'E' || fds.size() != ports_.size() + 1)
    throw Error("egress: the listeners handed over are not the ones asked for");
  for (std::size_t i = 0; i < fds.size(); ++i) {
    const bool tcp = i < ports_.size();
    const std::uint16_t port = tcp ? ports_[i] : kDnsPort;
    if (socket_option(fds[i].get(), SO_TYPE) != (tcp ? SOCK_STREAM : SOCK_DGRAM) ||
        (tcp && socket_option(fds[i].get(), SO_ACCEPTCONN) != 1) ||
        bound_port(fds[i].get()) != port)
      throw Error("egress: the listeners handed over are not the ones asked for");
  }
  return fds;
}

}  // namespace rlm::netns
