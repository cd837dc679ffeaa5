// One netlink request sent from the child between clone and exec, and the kernel's ack read:
// the bytes are built in the parent (with libnl); this only opens a NETLINK_ROUTE socket, sends
// them and reads the NLMSG_ERROR that answers `sequence`. Async-signal-safe, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "process/child_failure.hpp"

namespace rlm::netns {

// 0 when the kernel acked the request, else the errno it answered (or of the socket call that
// failed, with `failure` set to `step` then too). `failure` is left alone for a kernel refusal,
// so a caller may tolerate one (an IPv6 route where the kernel has no IPv6).
int send_netlink_request(const std::uint8_t* bytes, std::size_t size, std::uint32_t sequence,
                         const char* step, process::ChildFailure& failure) noexcept;

}  // namespace rlm::netns
