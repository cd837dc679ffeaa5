#include "server/socket_access.hpp"

#include <endian.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::server {
namespace {

// The kernel's form of an access ACL, the value of the system.posix_acl_access attribute
// (linux/posix_acl_xattr.h, not in every distribution's headers): a little-endian version, then
// entries ordered by tag and, within a tag, by id.
constexpr std::uint32_t kAclVersion = 2;
enum AclTag : std::uint16_t {
  kUserObj = 0x01,
  kUser = 0x02,
  kGroupObj = 0x04,
  kGroup = 0x08,
  kMask = 0x10,
  kOther = 0x20,
};
constexpr std::uint32_t kUndefinedId = 0xffffffff;
constexpr std::uint16_t kReadWrite = 4 | 2;

struct AclEntry {
  std::uint16_t tag, perm;
  std::uint32_t id;
};

void append(std::string& value, AclTag tag, std::uint16_t perm, std::uint32_t id) {
  const AclEntry entry{htole16(tag), htole16(perm), htole32(id)};
  value.append(reinterpret_cast<const char*>(&entry), sizeof entry);
}

template <typename Id>
std::vector<Id> sorted_unique(std::vector<Id> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

void grant_socket_access(const std::string& path, mode_t mode, const std::vector<uid_t>& uids,
                         const std::vector<gid_t>& gids) {
  if ((uids.empty() && gids.empty()) || (mode & 0002)) return;
  const std::uint32_t version = htole32(kAclVersion);
  std::string value(reinterpret_cast<const char*>(&version), sizeof version);
  append(value, kUserObj, (mode >> 6) & 7, kUndefinedId);
  for (const uid_t uid : sorted_unique(uids)) append(value, kUser, kReadWrite, uid);
  append(value, kGroupObj, (mode >> 3) & 7, kUndefinedId);
  for (const gid_t gid : sorted_unique(gids)) append(value, kGroup, kReadWrite, gid);
  // The mask bounds every named entry and the owning group: theirs together.
  append(value, kMask, static_cast<std::uint16_t>(kReadWrite | ((mode >> 3) & 7)), kUndefinedId);
  append(value, kOther, mode & 7, kUndefinedId);
  if (setxattr(path.c_str(), "system.posix_acl_access", value.data(), value.size(), 0) == 0) return;
  if (errno == EOPNOTSUPP)
    throw Error("the filesystem of " + path +
                " keeps no ACLs, so the allowed uids and gids cannot be granted the socket file; "
                "put the socket on one that does (/run, /tmp), or give --socket-mode 0666 "
                "(every peer is still checked against --allow-uid and --allow-gid)");
  throw Error("cannot grant the allowed uids and gids the socket " + path +
              " (setxattr system.posix_acl_access): " + sys::errno_text(errno));
}

}  // namespace rlm::server
