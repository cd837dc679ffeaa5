#include "namespace/userns.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "namespace/setup_fix.hpp"
#include "process/child_start.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
namespace {

// One write, as the kernel requires for these files. Throws SetupError ("write <path>").
void write_map_file(const std::string& path, const std::string& content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw SetupError("write " + path, errno);
  const ssize_t written = write(fd, content.data(), content.size());
  const int error = written < 0 ? errno : EIO;
  close(fd);
  if (written != static_cast<ssize_t>(content.size())) throw SetupError("write " + path, error);
}

[[noreturn]] void owner_failed(const char* step, int error) {
  throw SetupError(step, error);
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::string value;
  std::getline(in, value);
  return value;
}

// Half of the runtime's own namespace's value of each shared budget (there, for a runtime in the
// host's namespace, these are the host's per-user limits, e.g. fs.inotify.max_user_instances);
// none for nested user namespaces. Only the files this kernel has.
std::vector<IdMapping::NamespaceLimit> prepare_namespace_limits() {
  std::vector<IdMapping::NamespaceLimit> limits;
  const auto add = [&](const std::string& name, bool halve) {
    const std::string path = "/proc/sys/user/" + name;
    std::ifstream in(path);
    long long value = -1;
    if (!(in >> value) || value < 0) return;
    const long long limit = halve ? std::max(1LL, value / 2) : 0;
    limits.push_back({path, std::to_string(limit) + "\n", "limit " + path});
  };
  for (const char* name : {"max_inotify_instances", "max_inotify_watches", "max_fanotify_groups",
                           "max_fanotify_marks"})
    add(name, true);
  add("max_user_namespaces", false);
  return limits;
}

}  // namespace

IdMapping prepare_id_mapping(const User& user) {
  IdMapping mapping;
  mapping.uid = user.uid;
  mapping.gid = user.gid;
  mapping.privileged = geteuid() == 0;
  if (mapping.privileged) {
    mapping.slot = SandboxUid::acquire(sandbox_uid_range());
    mapping.host_uid = mapping.slot.uid();
    mapping.host_gid = static_cast<gid_t>(mapping.slot.uid());
  } else {
    mapping.host_uid = geteuid();
    mapping.host_gid = getegid();
  }
  mapping.uid_map = std::to_string(mapping.uid) + " " + std::to_string(mapping.host_uid) + " 1\n";
  mapping.gid_map = std::to_string(mapping.gid) + " " + std::to_string(mapping.host_gid) + " 1\n";
  mapping.namespace_limits = prepare_namespace_limits();
  return mapping;
}

void write_id_maps(pid_t child, const IdMapping& mapping) {
  const std::string base = "/proc/" + std::to_string(child) + "/";
  // Written as the namespace's owner (privileged): the kernel lets a map be written by a holder of
  // CAP_SYS_ADMIN over the namespace, which its owner has there, and root has only with
  // CAP_SYS_ADMIN on the host -- which a container's root lacks (Docker's default capabilities).
  // CAP_SETUID and CAP_SETGID, still effective, allow the mapped host ids.
  const process::SignalsBlocked blocked;
  const OwnerSwitch owner(mapping);
  // Unprivileged gid maps need setgroups denied first (else dropping a group could grant access
  // that a "negative" group permission forbids). A privileged runtime leaves it allowed so the
  // child can drop root's groups; afterwards no one inside holds CAP_SETGID over a host gid.
  if (!mapping.privileged) write_map_file(base + "setgroups", "deny");
  write_map_file(base + "gid_map", mapping.gid_map);
  write_map_file(base + "uid_map", mapping.uid_map);
}

bool apply_ids(const IdMapping& mapping, bool set_namespace_limits,
               process::ChildFailure& failure) noexcept {
  // Raw syscalls: glibc's wrappers would try to run the change on every thread of the parent.
  if (mapping.privileged && syscall(SYS_setgroups, 0, nullptr) != 0) {
    failure.set("setgroups (drop supplementary groups)", errno);
    return false;
  }
  if (syscall(SYS_setresgid, mapping.gid, mapping.gid, mapping.gid) != 0) {
    failure.set("setresgid (sandbox gid)", errno);
    return false;
  }
  if (syscall(SYS_setresuid, mapping.uid, mapping.uid, mapping.uid) != 0) {
    failure.set("setresuid (sandbox uid)", errno);
    return false;
  }
  // The sysctl files of /proc/sys/user are the opener's user namespace's: this one's, writable
  // with the CAP_SYS_RESOURCE the child still holds in it. A runtime inside a container whose
  // /proc/sys is mounted read-only cannot set them: the sandbox then runs without these caps.
  if (!set_namespace_limits) return true;
  for (const auto& limit : mapping.namespace_limits) {
    const int fd = open(limit.path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == EROFS) continue;
    const ssize_t written = fd < 0 ? -1 : write(fd, limit.value.data(), limit.value.size());
    const int error = written < 0 ? errno : EIO;
    if (fd >= 0) close(fd);
    if (written != static_cast<ssize_t>(limit.value.size())) {
      failure.set(limit.step.c_str(), error);
      return false;
    }
  }
  return true;
}

namespace {

bool get_caps(__user_cap_data_struct (&caps)[2]) noexcept {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  return syscall(SYS_capget, &header, caps) == 0;
}

bool set_caps(__user_cap_data_struct (&caps)[2]) noexcept {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  return syscall(SYS_capset, &header, caps) == 0;
}

}  // namespace

OwnerSwitch::OwnerSwitch(const IdMapping& mapping) {
  if (!mapping.privileged) return;
  uid_t ruid = 0;
  gid_t rgid = 0, sgid = 0;
  if (syscall(SYS_getresuid, &ruid, &euid_, &suid_) != 0 ||
      syscall(SYS_getresgid, &rgid, &egid_, &sgid) != 0)
    owner_failed("getresuid", errno);
  if (!get_caps(caps_)) owner_failed("capget", errno);
  // The gid first, while CAP_SETGID is still effective. The saved uid becomes 0 so that the
  // permitted set survives the euid change (the kernel clears it when no uid is 0 any more); the
  // euid change clears the effective set and moves the fsuid along, both put back right after.
  if (syscall(SYS_setresgid, -1, mapping.host_gid, -1) != 0)
    owner_failed("setresgid (namespace owner)", errno);
  switched_ = true;
  if (syscall(SYS_setresuid, -1, mapping.host_uid, 0) != 0) {
    const int error = errno;
    restore();
    owner_failed("setresuid (namespace owner)", error);
  }
  syscall(SYS_setfsuid, euid_);
  syscall(SYS_setfsgid, egid_);
  if (!set_caps(caps_)) {
    const int error = errno;
    restore();
    owner_failed("capset (namespace owner)", error);
  }
}

OwnerSwitch::~OwnerSwitch() {
  restore();
}

void OwnerSwitch::restore() noexcept {
  if (!switched_) return;
  switched_ = false;
  // The permitted set was kept (the saved uid is 0), so these are allowed; the fs ids follow.
  if (syscall(SYS_setresuid, -1, euid_, suid_) != 0 || syscall(SYS_setresgid, -1, egid_, -1) != 0 ||
      !set_caps(caps_))
    std::abort();  // a thread of the host left with another uid: never carry on
}

std::string user_namespace_fix() {
  if (geteuid() != 0) {
    if (read_file("/proc/sys/kernel/unprivileged_userns_clone") == "0")
      return "sysctl -w kernel.unprivileged_userns_clone=1";
    if (read_file("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1")
      return "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 23.10+), or run "
             "rlm-sandbox as root";
  }
  if (read_file("/proc/sys/user/max_user_namespaces") == "0")
    return "sysctl -w user.max_user_namespaces=15000";
  return "run on a kernel with user namespaces (CONFIG_USER_NS), outside a container that "
         "forbids them (e.g. Docker's default seccomp profile denies clone/unshare of namespaces)";
}

}  // namespace rlm::ns
