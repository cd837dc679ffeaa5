#include "landlock/landlock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::landlock {
namespace {

// The kernel's UAPI (include/uapi/linux/landlock.h), spelled here: the build host's header may
// predate the ABI the running kernel offers.
struct RulesetAttr {
  std::uint64_t handled_access_fs;
  std::uint64_t handled_access_net;  // ABI 4
  std::uint64_t scoped;              // ABI 6
};

struct __attribute__((packed)) PathBeneathAttr {
  std::uint64_t allowed_access;
  std::int32_t parent_fd;
};

constexpr unsigned kCreateRulesetVersion = 1u << 0;
constexpr int kRulePathBeneath = 1;

constexpr std::uint64_t kFsExecute = 1ull << 0;
constexpr std::uint64_t kFsWriteFile = 1ull << 1;
constexpr std::uint64_t kFsReadFile = 1ull << 2;
constexpr std::uint64_t kFsReadDir = 1ull << 3;
constexpr std::uint64_t kFsRemoveDir = 1ull << 4;
constexpr std::uint64_t kFsRemoveFile = 1ull << 5;
constexpr std::uint64_t kFsMakeChar = 1ull << 6;
constexpr std::uint64_t kFsMakeDir = 1ull << 7;
constexpr std::uint64_t kFsMakeReg = 1ull << 8;
constexpr std::uint64_t kFsMakeSock = 1ull << 9;
constexpr std::uint64_t kFsMakeFifo = 1ull << 10;
constexpr std::uint64_t kFsMakeBlock = 1ull << 11;
constexpr std::uint64_t kFsMakeSym = 1ull << 12;
constexpr std::uint64_t kFsRefer = 1ull << 13;     // ABI 2
constexpr std::uint64_t kFsTruncate = 1ull << 14;  // ABI 3
constexpr std::uint64_t kFsIoctlDev = 1ull << 15;  // ABI 5

constexpr std::uint64_t kNetBindTcp = 1ull << 0;
constexpr std::uint64_t kNetConnectTcp = 1ull << 1;

constexpr std::uint64_t kScopeAbstractUnixSocket = 1ull << 0;
constexpr std::uint64_t kScopeSignal = 1ull << 1;

// The rights a rule on a non-directory may carry (anything else is EINVAL).
constexpr std::uint64_t kFileRights =
    kFsExecute | kFsWriteFile | kFsReadFile | kFsTruncate | kFsIoctlDev;

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

// Every filesystem right the kernel of `abi` knows.
std::uint64_t fs_rights(int abi) {
  if (abi < 1) return 0;
  std::uint64_t rights = kFsExecute | kFsWriteFile | kFsReadFile | kFsReadDir | kFsRemoveDir |
                         kFsRemoveFile | kFsMakeChar | kFsMakeDir | kFsMakeReg | kFsMakeSock |
                         kFsMakeFifo | kFsMakeBlock | kFsMakeSym;
  if (abi >= kAbiRefer) rights |= kFsRefer;
  if (abi >= kAbiTruncate) rights |= kFsTruncate;
  if (abi >= kAbiIoctlDev) rights |= kFsIoctlDev;
  return rights;
}

// The size of the ruleset attribute the kernel of `abi` reads.
std::size_t attr_size(int abi) {
  if (abi >= kAbiScoped) return sizeof(RulesetAttr);
  if (abi >= kAbiTcp) return offsetof(RulesetAttr, scoped);
  return offsetof(RulesetAttr, handled_access_net);
}

int add_path_rule(int ruleset_fd, int path_fd, std::uint64_t bits) noexcept {
  struct stat status;
  if (fstat(path_fd, &status) != 0) return -errno;
  if (S_ISLNK(status.st_mode)) return -ELOOP;
  if (!S_ISDIR(status.st_mode)) bits &= kFileRights;
  if (bits == 0) return 0;  // nothing this ABI can grant on it
  PathBeneathAttr attr{};
  attr.allowed_access = bits;
  attr.parent_fd = path_fd;
  if (syscall(SYS_landlock_add_rule, ruleset_fd, kRulePathBeneath, &attr, 0u) != 0) return -errno;
  return 0;
}

}  // namespace

int abi_version() {
  static const int version = [] {
    const long result =
        syscall(SYS_landlock_create_ruleset, nullptr, std::size_t{0}, kCreateRulesetVersion);
    return result < 0 ? 0 : static_cast<int>(result);
  }();
  return version;
}

RulesetOptions enforced(const RulesetOptions& wanted) {
  const int abi = abi_version();
  RulesetOptions result;
  result.filesystem = wanted.filesystem && abi >= 1;
  result.deny_tcp = wanted.deny_tcp && abi >= kAbiTcp;
  result.scope_abstract_unix = wanted.scope_abstract_unix && abi >= kAbiScoped;
  result.scope_signals = wanted.scope_signals && abi >= kAbiScoped;
  return result;
}

Ruleset prepare_ruleset(const RulesetOptions& options) {
  const int abi = abi_version();
  if (abi < 1)
    throw Error(
        "Landlock is not available: the kernel has none (5.13 or later with "
        "CONFIG_SECURITY_LANDLOCK), it is not in the boot's lsm= list, or a seccomp filter "
        "refuses landlock_create_ruleset");
  const RulesetOptions what = enforced(options);
  RulesetAttr attr{};
  if (what.filesystem) attr.handled_access_fs = fs_rights(abi);
  if (what.deny_tcp) attr.handled_access_net = kNetBindTcp | kNetConnectTcp;
  if (what.scope_abstract_unix) attr.scoped |= kScopeAbstractUnixSocket;
  if (what.scope_signals) attr.scoped |= kScopeSignal;
  const long fd = syscall(SYS_landlock_create_ruleset, &attr, attr_size(abi), 0u);
  if (fd < 0) throw Error("landlock_create_ruleset: " + sys::errno_text(errno));
  return Ruleset(host::UniqueFd(static_cast<int>(fd)), attr.handled_access_fs);
}

unsigned long long access_bits(unsigned access) {
  const std::uint64_t known = fs_rights(abi_version());
  std::uint64_t bits = 0;
  if (access & read) bits |= kFsReadFile | kFsReadDir;
  if (access & write)
    bits |= kFsWriteFile | kFsRemoveDir | kFsRemoveFile | kFsMakeDir | kFsMakeReg | kFsMakeSock |
            kFsMakeFifo | kFsMakeSym | kFsRefer | kFsTruncate | kFsIoctlDev;
  if (access & execute) bits |= kFsExecute;
  return bits & known;
}

void allow_beneath(Ruleset& ruleset, const std::string& host_path, unsigned access) {
  if (!ruleset) throw Error("allow_beneath(" + host_path + "): no ruleset");
  const host::UniqueFd path(open(host_path.c_str(), O_PATH | O_CLOEXEC | O_NOFOLLOW));
  if (!path)
    throw Error("cannot open " + host_path + " for a Landlock rule: " + sys::errno_text(errno));
  const int result =
      add_path_rule(ruleset.fd(), path.get(), access_bits(access) & ruleset.handled_fs());
  if (result == -ELOOP)
    throw Error("a Landlock rule on " + host_path +
                ": it is a symbolic link; name the path it points to");
  if (result != 0) throw Error("landlock_add_rule(" + host_path + "): " + sys::errno_text(-result));
}

int apply_allow_beneath(int ruleset_fd, const char* path, unsigned long long bits) noexcept {
  const int fd = open(path, O_PATH | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  const int result = add_path_rule(ruleset_fd, fd, bits);
  close(fd);
  return result;
}

int apply_restrict_self(int ruleset_fd) noexcept {
  if (syscall(SYS_landlock_restrict_self, ruleset_fd, 0u) != 0) return -errno;
  return 0;
}

}  // namespace rlm::landlock
