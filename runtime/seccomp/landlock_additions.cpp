// The landlock backend's own seccomp filter (seccomp.hpp, LandlockAdditions): stacked beneath the
// policy's filter, it closes what Landlock leaves open on a host the payload shares.
// docs/seccomp.md and docs/landlock-backend.md list each rule and why.
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "seccomp/model.hpp"

namespace rlm::seccomp::detail {
namespace {

constexpr Action kEperm{Verdict::errno_, EPERM};
constexpr Action kEacces{Verdict::errno_, EACCES};

constexpr unsigned kDomainArg = 0;

// Reaching into another process of the same uid (the runtime's, when it cannot switch uids), and
// the io_uring interface, whose operations bypass the socket rules below. The payload's preamble
// denies them too; here they hold for rlm-sandbox-init as well.
constexpr std::string_view kAlwaysDenied[] = {
    "ptrace",         "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "io_uring_setup", "io_uring_enter",   "io_uring_register"};

// Watches: Landlock does not mediate inotify or fanotify (a watch needs only read permission on
// the inode), so a payload refused listdir(/tmp) could watch the host's /tmp and learn the names
// of the files other users create there. No watch can be told apart by its path here, so none is
// allowed: EACCES, as for a path the payload may not read. fanotify_init is refused as it is
// without CAP_SYS_ADMIN on kernels before 5.13 (EPERM); inotify_init itself stays usable.
constexpr std::string_view kWatches[] = {"inotify_add_watch", "fanotify_mark"};

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

Filter landlock_additions(bool network_none) {
  Filter filter;
  filter.default_action = {Verdict::allow, 0};
  for (const auto name : kAlwaysDenied) deny(filter, name, {}, kEperm);
  for (const auto name : kWatches) deny(filter, name, {}, kEacces);
  deny(filter, "fanotify_init", {}, kEperm);
  if (!network_none) return filter;
  for (const auto name : kIpc) deny(filter, name, {}, kEperm);
  // Every AF_INET and AF_INET6 socket. Landlock's TCP rule checks bind(2) and connect(2) only:
  // sendto(MSG_FASTOPEN) connects without connect(2), listen(2) on an unbound socket binds to an
  // ephemeral port on every address without bind(2), and UDP, raw, SCTP and MPTCP sockets are
  // outside the rule. A sandbox on the host's network has no loopback of its own to use them
  // for. The domain is an int: only its low half is compared, as the kernel reads it.
  for (const std::uint32_t family : {AF_INET, AF_INET6})
    deny(filter, "socket", {low32_is(kDomainArg, family)}, kEacces);
  return filter;
}

}  // namespace rlm::seccomp::detail
