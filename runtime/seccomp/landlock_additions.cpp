// The landlock backend's own seccomp filter (seccomp.hpp, LandlockAdditions): stacked beneath the
// policy's filter, it closes what Landlock leaves open on a host the payload shares.
// docs/seccomp.md and docs/landlock-backend.md list each rule and why.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "seccomp/model.hpp"

namespace rlm::seccomp::detail {
namespace {

constexpr Action kEperm{Verdict::errno_, EPERM};
constexpr Action kEacces{Verdict::errno_, EACCES};

constexpr unsigned kDomainArg = 0, kTypeArg = 1, kProtocolArg = 2;
constexpr std::uint32_t kSockTypeMask = 0xf;  // the kernel's SOCK_TYPE_MASK

// Reaching into another process of the same uid (the runtime's, when it cannot switch uids), and
// the io_uring interface, whose operations bypass the socket rules below. The payload's preamble
// denies them too; here they hold for rlm-sandbox-init as well.
constexpr std::string_view kAlwaysDenied[] = {
    "ptrace",         "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "io_uring_setup", "io_uring_enter",   "io_uring_register"};

// SysV IPC and POSIX message queues: the host's IPC namespace, a channel to any other process on
// it. Denied under network "none".
constexpr std::string_view kIpc[] = {
    "shmget",  "shmat",     "shmdt",        "shmctl",          "msgget",     "msgsnd",
    "msgrcv",  "msgctl",    "semget",       "semop",           "semtimedop", "semctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",  "mq_getsetattr"};

Comparison low32_is(unsigned arg, std::uint32_t value) {
  return {arg, SCMP_CMP_MASKED_EQ, 0xffffffffu, value};
}

void deny(Filter& filter, std::string_view name, Conditions conditions, Action action) {
  filter.rules.push_back({std::string(name), std::move(conditions), action, "landlock backend"});
}

}  // namespace

Filter landlock_additions(bool network_none, bool tcp_confined) {
  Filter filter;
  filter.default_action = {Verdict::allow, 0};
  for (const auto name : kAlwaysDenied) deny(filter, name, {}, kEperm);
  if (!network_none) return filter;
  for (const auto name : kIpc) deny(filter, name, {}, kEperm);
  // An AF_INET or AF_INET6 socket. Without Landlock's TCP rule (ABI < 4) none at all; with it,
  // only plain TCP: SOCK_STREAM with protocol 0 or IPPROTO_TCP, so neither UDP, raw sockets,
  // SCTP nor MPTCP (IPPROTO_MPTCP, a SOCK_STREAM protocol Landlock's TCP rule does not cover) is
  // left. The domain and protocol are ints: only their low halves are compared, as the kernel
  // reads them; the type's flags (SOCK_CLOEXEC, SOCK_NONBLOCK) are masked off.
  for (const std::uint32_t family : {AF_INET, AF_INET6}) {
    if (!tcp_confined) {
      deny(filter, "socket", {low32_is(kDomainArg, family)}, kEacces);
      continue;
    }
    for (std::uint32_t type = 0; type <= kSockTypeMask; ++type) {
      if (type == SOCK_STREAM) continue;
      deny(filter, "socket",
           {low32_is(kDomainArg, family), {kTypeArg, SCMP_CMP_MASKED_EQ, kSockTypeMask, type}},
           kEacces);
    }
    const std::uint32_t tcp[] = {0, IPPROTO_TCP};
    for (auto other : complement_low32(kProtocolArg, tcp)) {
      Conditions conditions{low32_is(kDomainArg, family),
                            {kTypeArg, SCMP_CMP_MASKED_EQ, kSockTypeMask, SOCK_STREAM}};
      conditions.insert(conditions.end(), other.begin(), other.end());
      deny(filter, "socket", std::move(conditions), kEacces);
    }
  }
  return filter;
}

}  // namespace rlm::seccomp::detail
