#include "host/sandbox_uid.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::host {
namespace {

bool parse_id(std::string_view text, std::uint64_t& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool forbidden_inside(const UidRange& range, std::uint64_t id) {
  return range.first <= id && id <= range.last;
}

// The lock directory, made when missing, opened without following a link; refused unless the
// runtime's uid owns it and nobody else may enter it (else another user could hold, or remove and
// replace, the files the slots are locked on).
UniqueFd open_lock_dir(const std::string& path) {
  const auto fail = [&](const std::string& why) -> UniqueFd {
    throw Error("the sandbox uid locks' directory " + path + " " + why + "; to fix: make it a " +
                "directory of the runtime's user with mode 0700, or set " + kUidLockDirVariable +
                " to one");
  };
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return fail("cannot be made: " + sys::errno_text(errno));
  UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return fail("cannot be opened: " + sys::errno_text(errno));
  struct stat st {};
  if (::fstat(dir.get(), &st) != 0) return fail("cannot be read: " + sys::errno_text(errno));
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    return fail("belongs to uid " + std::to_string(st.st_uid) + " with mode " +
                std::to_string(st.st_mode & 07777) + " (decimal); others could hold its locks");
  return dir;
}

// RLM_SANDBOX_UID_LOCK_DIR when set; else the first of /run, /dev/shm and /tmp that exists and is
// writable (a container's root may have no /run). Every runtime of one mount namespace picks the
// same one.
UniqueFd open_lock_dir() {
  if (const char* value = std::getenv(kUidLockDirVariable); value && *value)
    return open_lock_dir(value);
  for (const char* parent : {"/run", "/dev/shm", "/tmp"})
    if (::access(parent, W_OK | X_OK) == 0)
      return open_lock_dir(std::string(parent) + "/" + kUidLockDirName);
  return open_lock_dir(kDefaultUidLockDir);  // fails, saying why
}

// Locks the slot's file; an fd on success, none when another holder has it.
UniqueFd try_hold(int dir, uid_t uid) {
  const std::string name = std::to_string(uid);
  UniqueFd fd(
      ::openat(dir, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600));
  if (!fd)
    throw Error("cannot open the lock of sandbox uid " + name + ": " + sys::errno_text(errno));
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return {};
    throw Error("cannot lock sandbox uid " + name + ": " + sys::errno_text(errno));
  }
  return fd;
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

HostIds sandbox_write_owner(const HostIds& caller) {
  if (caller.uid != 0 && caller.gid != 0) return caller;
  uid_t output = kDefaultOutputUid;
  if (const char* value = std::getenv(kOutputUidVariable)) {
    std::uint64_t id = 0;
    if (!parse_id(value, id) || id == 0 || id == 65534 || id == 65535 || id >= 0xFFFFFFFFu)
      throw Error(std::string(kOutputUidVariable) + "=\"" + value +
                  "\": not a uid that may own a sandbox's output (decimal; not 0, 65534, 65535 "
                  "or 4294967295)");
    output = static_cast<uid_t>(id);
  }
  const UidRange range = sandbox_uid_range();
  if (forbidden_inside(range, output))
    throw Error(
        std::string(kOutputUidVariable) + " " + std::to_string(output) +
        " lies inside the sandbox uid range " + range.describe() +
        ": a sandbox would run as the owner of other sandboxes' output; to fix: set it, or " +
        kUidRangeVariable + ", so that they do not overlap");
  return {caller.uid == 0 ? output : caller.uid,
          caller.gid == 0 ? static_cast<gid_t>(output) : caller.gid};
}

SandboxUid SandboxUid::acquire(const UidRange& range) {
  const UniqueFd dir = open_lock_dir();
  for (std::uint64_t uid = range.first; uid <= range.last; ++uid) {
    auto fd = try_hold(dir.get(), static_cast<uid_t>(uid));
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

}  // namespace rlm::host
