#include "landlock_backend/confinement.hpp"

#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "host/owned_files.hpp"
#include "policy/python_environment.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm::landlock_backend {
namespace {

namespace fs = std::filesystem;

// Devices a payload may open read-write (the namespace backend's /dev has the same ones).
constexpr const char* kDevices[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                                    "/dev/urandom"};

// The directory the tmpfs stand-ins go in: the runtime's TMPDIR when it is an absolute path,
// else /tmp.
std::string stand_in_parent() {
  const char* value = std::getenv("TMPDIR");
  if (value && value[0] == '/') return value;
  return "/tmp";
}

bool beneath(const std::string& path, const std::string& dir) {
  if (dir == "/") return path.starts_with("/");
  return path == dir || (path.starts_with(dir) && path[dir.size()] == '/');
}

// The host path a bind's rule goes on: its source with symbolic links resolved (/bin -> usr/bin),
// so the rule names the inode the payload reaches. "" for an optional source that is missing.
std::string rule_path(const Mount& mount) {
  std::error_code error;
  const fs::path resolved = fs::canonical(mount.source, error);
  if (!error) return resolved.string();
  if (mount.optional && error == std::errc::no_such_file_or_directory) return "";
  throw Error("filesystem.mounts: bind source " + mount.source + ": " + error.message());
}

}  // namespace

Confinement Confinement::prepare(const Policy& policy, const std::string& init_path,
                                 const HostIds& bind_owner) {
  Confinement c;
  const bool root = geteuid() == 0;
  if (root) {
    c.bind_owner_ = host::sandbox_write_owner(bind_owner);
    c.slot_ = host::SandboxUid::acquire(host::sandbox_uid_range());
    c.uid_ = c.slot_.uid();
    c.gid_ = static_cast<gid_t>(c.slot_.uid());
  } else {
    c.uid_ = getuid();
    c.gid_ = getgid();
  }

  const bool network_none = policy.network != Network::host;  // an allowlist: nothing open here
  const landlock::RulesetOptions wanted{.filesystem = true,
                                        .deny_tcp = network_none,
                                        .scope_abstract_unix = true,
                                        .scope_signals = true};
  c.ruleset_ = landlock::prepare_ruleset(wanted);
  c.seccomp_ = seccomp::compile_landlock_additions({.network_none = network_none}).instructions;

  using landlock::execute;
  using landlock::read;
  using landlock::write;
  for (const auto& mount : policy.filesystem.mounts) {
    if (mount.type == Mount::Type::tmpfs) {
      std::string pattern = stand_in_parent() + "/rlm-sandbox-landlock-XXXXXX";
      if (!mkdtemp(pattern.data()))
        throw Error("cannot make the stand-in for tmpfs " + mount.target + " in " +
                    stand_in_parent() + ": " + sys::errno_text(errno));
      c.tmpfs_.push_back({mount.target, pattern});
      // mkdtemp's 0700 is less the host process's umask, which is not the sandbox's business.
      if (chmod(pattern.c_str(), 0700) != 0)
        throw Error("chmod " + pattern + ": " + sys::errno_text(errno));
      if (root && chown(pattern.c_str(), c.uid_, c.gid_) != 0)
        throw Error("chown " + pattern + ": " + sys::errno_text(errno));
      // Like the namespace backend's tmpfs: nothing executes from it.
      landlock::allow_beneath(c.ruleset_, pattern, read | write);
      if (c.tmp_dir_.empty() || mount.target == "/tmp") c.tmp_dir_ = pattern;
      continue;
    }
    const std::string path = rule_path(mount);
    if (path.empty()) continue;
    landlock::allow_beneath(c.ruleset_, path,
                            mount.readonly ? read | execute : read | write | execute);
    if (!mount.readonly) c.writable_.push_back(path);
  }
  for (const auto& dir : policy::python_dirs(policy))
    if (!dir.bound_by_policy) landlock::allow_beneath(c.ruleset_, dir.path, read | execute);
  for (const char* device : kDevices)
    if (access(device, F_OK) == 0) landlock::allow_beneath(c.ruleset_, device, read | write);
  landlock::allow_beneath(c.ruleset_, fs::canonical(init_path).string(), read | execute);
  // The host's /proc, read-only: a session's worker finds the processes a rollback kills there.
  // It shows every host process (isolation.pid); what needs ptrace access (environ, mem, fd,
  // maps) Landlock refuses for any process outside the sandbox's domain, and magic links
  // (/proc/PID/root, cwd) lead to paths checked like any other.
  landlock::allow_beneath(c.ruleset_, "/proc", read);
  return c;
}

Confinement::~Confinement() {
  for (const auto& dir : tmpfs_) {
    std::error_code ignored;
    fs::remove_all(dir.host, ignored);
  }
  if (!slot_.held()) return;
  for (const auto& path : writable_)
    if (!host::give_to_owner(path, uid_, gid_, bind_owner_)) slot_.quarantine();
}

std::string Confinement::payload_path(const std::string& policy_path) const {
  // The innermost tmpfs target holding the path wins.
  const TmpfsDir* best = nullptr;
  for (const auto& dir : tmpfs_)
    if (beneath(policy_path, dir.target) && (!best || dir.target.size() > best->target.size()))
      best = &dir;
  if (!best) return policy_path;
  if (best->target == "/") return best->host + policy_path;
  return best->host + policy_path.substr(best->target.size());
}

bool Confinement::apply_in_child(process::ChildFailure& failure) const noexcept {
  const auto fail = [&failure](const char* step) {
    failure.set(step, errno);
    return false;
  };
  if (slot_.held()) {
    // Raw syscalls: glibc's wrappers would try to reach other threads of a process that has one.
    if (syscall(SYS_setgroups, 0, nullptr) != 0) return fail("setgroups");
    if (syscall(SYS_setresgid, gid_, gid_, gid_) != 0) return fail("setresgid");
    if (syscall(SYS_setresuid, uid_, uid_, uid_) != 0) return fail("setresuid");
  }
  // None left: permitted, effective, inheritable (so none ambient either).
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capset, &header, data) != 0) return fail("capset (dropping every capability)");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("prctl(PR_SET_NO_NEW_PRIVS)");
  if (const int error = landlock::apply_restrict_self(ruleset_.fd()); error != 0) {
    errno = -error;
    return fail("landlock_restrict_self");
  }
  sock_fprog program{static_cast<unsigned short>(seccomp_.size()),
                     const_cast<sock_filter*>(seccomp_.data())};
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0)
    return fail("seccomp (the landlock backend's filter)");
  return true;
}

}  // namespace rlm::landlock_backend
