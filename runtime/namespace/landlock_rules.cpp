// LandlockPlan (child_setup.hpp): the namespace backend's Landlock ruleset, made from the root
// filesystem's plan. prepare() in the parent, apply() in the cloned child after the mounts, with
// raw syscalls only (the module's apply_* calls). docs/namespace-backend.md#landlock-beneath-the-
// mounts says what each part of the tree is allowed and why.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "landlock/landlock.hpp"
#include "namespace/child_setup.hpp"
#include "rlm_init/protocol.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
namespace {

using Kind = RootfsPlan::Reach::Kind;

// Listing a directory (LANDLOCK_ACCESS_FS_READ_DIR; the module's `read` also reads files).
constexpr unsigned long long kReadDir = 1ULL << 3;

// What each part of the tree is allowed. Mount flags still apply on top (a read-only bind given
// write rights stays read-only); Landlock only takes away.
unsigned long long access_for(const RootfsPlan::Reach& reach) {
  using landlock::Access;
  using landlock::access_bits;
  switch (reach.kind) {
    case Kind::list:
      // The root tmpfs: its directories are listed (`ls /`), its files are the generated ones,
      // which have rules of their own. Were the host root left attached under it by mistake,
      // its files would still be out of reach.
      return access_bits(Access::read) & kReadDir;
    case Kind::read:
      return access_bits(Access::read);
    case Kind::read_exec:
      return access_bits(Access::read | Access::execute);
    case Kind::writable:
      return access_bits(Access::read | Access::write | Access::execute);
    case Kind::device:  // the nodes, their ioctls (terminals, /dev/pts), /dev/shm; noexec
    case Kind::proc:    // /proc/self/... writes (oom_score_adj, comm, attr); noexec
      return access_bits(Access::read | Access::write);
  }
  return 0;
}

}  // namespace

std::optional<LandlockPlan> LandlockPlan::prepare(const Policy& policy, const RootfsPlan& rootfs,
                                                  const std::string& init_path) {
  if (landlock::abi_version() == 0) return std::nullopt;
  landlock::RulesetOptions options;
  options.filesystem = true;
  options.scope_signals = policy.namespaces.pid;
  options.scope_abstract_unix = policy.network != Network::host;
  landlock::Ruleset ruleset = landlock::prepare_ruleset(options);
  // The child execs init by fd; Landlock checks that exec against init's path on the host (the
  // file itself: a rule names no link, so an installed link is resolved first).
  char resolved[PATH_MAX];
  if (!realpath(init_path.c_str(), resolved))
    throw Error("cannot resolve " + init_path + ": " + sys::errno_text(errno));
  landlock::allow_beneath(ruleset, resolved, landlock::Access::read | landlock::Access::execute);
  // Above the fds the child moves onto 0-3, like every fd it keeps.
  const int fd = fcntl(ruleset.fd(), F_DUPFD_CLOEXEC, init_protocol::kReportFd + 1);
  if (fd < 0) throw Error("cannot keep the Landlock ruleset: " + sys::errno_text(errno));
  LandlockPlan plan;
  plan.fd_ = host::UniqueFd(fd);
  for (const auto& reach : rootfs.reach())
    plan.rules_.push_back({reach.path, access_for(reach), "landlock rule for " + reach.path});
  return plan;
}

std::string LandlockPlan::describe_host() {
  const int abi = landlock::abi_version();
  if (abi == 0)
    return "no Landlock (the kernel has none, it is disabled, or a seccomp profile refuses its "
           "calls): the mount namespace alone keeps the host's files out of reach";
  return "Landlock (ABI " + std::to_string(abi) +
         ") beneath the mounts: the sandbox's processes may open only what its mounts show, "
         "even through a descriptor from outside; signals and (network none) abstract unix "
         "sockets scoped to the sandbox";
}

bool LandlockPlan::apply(process::ChildFailure& failure) const noexcept {
  const int fd = fd_.get();
  for (const Rule& rule : rules_) {
    const int rc = landlock::apply_allow_beneath(fd, rule.path.c_str(), rule.access);
    if (rc != 0) {
      failure.set(rule.step.c_str(), -rc);
      return false;
    }
  }
  const int rc = landlock::apply_restrict_self(fd);
  if (rc != 0) {
    failure.set("landlock_restrict_self", -rc);
    return false;
  }
  ::close(fd);  // this process's copy: init never holds the ruleset
  return true;
}

}  // namespace rlm::ns
