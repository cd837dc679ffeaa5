#include "common/sandbox_uid.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::common {
namespace {

constexpr char kLockPrefix[] = "rlm-sandbox/uid/";

bool parse_id(std::string_view text, std::uint64_t& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool forbidden_inside(const UidRange& range, std::uint64_t id) {
  return range.first <= id && id <= range.last;
}

// Binds the slot's abstract name; an fd on success, none when another holder has it.
UniqueFd try_hold(uid_t uid) {
  UniqueFd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) throw Error("socket(AF_UNIX): " + sys::errno_text(errno));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = kLockPrefix + std::to_string(uid);
  // Abstract: a leading NUL, no file anywhere, gone with the socket.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0) return fd;
  if (errno == EADDRINUSE) return {};
  throw Error("bind(@" + name + ") to hold a sandbox uid: " + sys::errno_text(errno));
}

}  // namespace

std::string UidRange::describe() const {
  return std::to_string(first) + "-" + std::to_string(last);
}

UidRange parse_uid_range(const std::string& text, const std::string& origin) {
  const auto fail = [&](const std::string& why) -> UidRange {
    throw Error(origin + "=\"" + text + "\": " + why +
                "; to fix: set it to FIRST-LAST, a range of host uids no user, service or subuid "
                "range uses (default " +
                UidRange{}.describe() + ")");
  };
  const auto dash = text.find('-');
  std::uint64_t first = 0, last = 0;
  if (dash == std::string::npos || !parse_id(std::string_view(text).substr(0, dash), first) ||
      !parse_id(std::string_view(text).substr(dash + 1), last))
    return fail("not FIRST-LAST (decimal uids)");
  if (first > last) return fail("FIRST is above LAST");
  if (last >= 0xFFFFFFFFu) return fail("4294967295 is (uid_t)-1, never a uid");
  const UidRange range{static_cast<uid_t>(first), static_cast<uid_t>(last)};
  for (std::uint64_t id : {0ull, 65534ull, 65535ull})
    if (forbidden_inside(range, id))
      return fail("includes " + std::to_string(id) +
                  (id == 0       ? " (root)"
                   : id == 65534 ? " (nobody)"
                                 : " ((uint16_t)-1)"));
  return range;
}

UidRange sandbox_uid_range() {
  const char* value = std::getenv(kUidRangeVariable);
  if (!value) return {};
  return parse_uid_range(value, kUidRangeVariable);
}

SandboxUid SandboxUid::acquire(const UidRange& range) {
  for (std::uint64_t uid = range.first; uid <= range.last; ++uid) {
    auto fd = try_hold(static_cast<uid_t>(uid));
    if (!fd) continue;
    SandboxUid slot;
    slot.lock_ = std::move(fd);
    slot.uid_ = static_cast<uid_t>(uid);
    return slot;
  }
  throw Error("every host uid of the sandbox range " + range.describe() +
              " is held by a live sandbox (" + std::to_string(range.last - range.first + 1ull) +
              " at once); to fix: wait for one to end, or widen " + kUidRangeVariable +
              " (FIRST-LAST) in the runtime's environment");
}

}  // namespace rlm::common
