// RootfsPlan: the sandbox's root filesystem. prepare() turns the policy and what it finds on the
// host into a flat list of operations; apply() replays them in the cloned child with raw
// syscalls. docs/namespace-rootfs.md describes the resulting tree.
//
// The shape of apply(), in the child's private mount namespace:
//   1. everything made private, so nothing propagates back to the host;
//   2. a small tmpfs is mounted on /tmp and becomes the root at once (pivot_root), with the host
//      root kept under /.rlm-old-root. Every bind is then taken from /.rlm-old-root/<source>, so
//      sources anywhere (including under /tmp, which the staging tmpfs covered) stay reachable;
//   3. the policy's mounts, /dev, /proc (masked), /etc/passwd and /etc/group, the workdir;
//   4. the host root is detached, / remounted read-only, the cwd set to the workdir.
// After pivot_root, every path is resolved inside the new root with openat2(RESOLVE_IN_ROOT |
// RESOLVE_NO_SYMLINKS): read-write binds hold whatever earlier sandboxes left there, and a link
// they planted must never lead a mkdir, a file or a mount out of the tree (say into
// /.rlm-old-root, the host root). Mounts then name their source and target by descriptor, through
// the host procfs' /proc/self/fd, which the kernel resolves to exactly the opened object.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "namespace/child_setup.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

struct RootfsPlan::Op {
  enum class Kind { mount, mkdir, touch, symlink, write_file, pivot_root, detach, rmdir, chdir };
  Kind kind = Kind::mount;
  std::string step;    // what StepFailure names, e.g. "bind /usr"
  std::string path;    // the object of the operation (mount target, directory, file, link)
  std::string parent;  // path's directory and last component, for the *at() calls
  std::string leaf;
  std::string source;  // mount source, symlink contents, pivot_root's put_old
  std::string fstype;
  std::string data;  // mount options, file contents
  unsigned long flags = 0;
  mode_t mode = 0;
  bool exists_ok = false;  // mkdir/touch: an existing entry is fine
  // A submount remount whose mount point is hidden by a later mount or not reachable by the
  // sandbox uid: whatever the sandbox cannot reach needs no flags.
  bool unreachable_ok = false;
};

RootfsPlan::RootfsPlan() = default;
RootfsPlan::~RootfsPlan() = default;
RootfsPlan::RootfsPlan(RootfsPlan&&) noexcept = default;
RootfsPlan& RootfsPlan::operator=(RootfsPlan&&) noexcept = default;

namespace {

// Where the new root is staged before the first pivot_root, and where the host root then sits
// until it is detached.
constexpr const char* kStaging = "/tmp";
constexpr const char* kOldRootName = ".rlm-old-root";
constexpr const char* kOldRoot = "/.rlm-old-root";

constexpr std::uint64_t kRootTmpfsBytes = 1 << 20;  // only mount points and /etc files
constexpr std::uint64_t kDevTmpfsBytes = 64 << 10;  // only mount points and links
constexpr std::uint64_t kMinTmpfsBytes = 4096;      // tmpfs reads size=0 as "unlimited"

// Host device nodes bound into /dev (mknod is not allowed in a user namespace).
constexpr const char* kDevices[] = {"null", "zero", "full", "random", "urandom", "tty"};

// /proc entries hidden from the sandbox: Docker's masked paths (kcore, keys, latency_stats,
// timer_list, timer_stats, sched_debug, interrupts, acpi, asound, scsi), more kernel memory and
// addresses, the host's keyring metadata, page-frame maps, sysrq, hardware directories, and what
// identifies or measures the host: its boot id and kernel command line, the load average (whose
// fourth field counts every thread on the host), pressure stall information and the file locks
// of every process. Files get /dev/null bound over them, directories an empty read-only tmpfs.
// Only those that exist on the host are masked. docs/security.md lists what stays visible.
constexpr const char* kProcMasked[] = {"kcore",
                                       "kmsg",
                                       "keys",
                                       "key-users",
                                       "kallsyms",
                                       "interrupts",
                                       "latency_stats",
                                       "timer_list",
                                       "timer_stats",
                                       "sched_debug",
                                       "kpagecount",
                                       "kpageflags",
                                       "kpagecgroup",
                                       "config.gz",
                                       "sysrq-trigger",
                                       "cmdline",
                                       "loadavg",
                                       "locks",
                                       "sys/kernel/random/boot_id",
                                       "acpi",
                                       "asound",
                                       "scsi",
                                       "firmware",
                                       "driver",
                                       "pressure"};
// /proc subtrees that stay visible but read-only (kernel tunables, irq affinity, bus config).
constexpr const char* kProcReadOnly[] = {"sys", "irq", "bus", "fs"};

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw Error(where + ": " + message);
}

std::string errno_text(int error) {
  return std::strerror(error);
}

std::string octal(mode_t mode) {
  std::ostringstream out;
  out << std::oct << mode;
  return out.str();
}

std::string tmpfs_options(std::uint64_t bytes, mode_t mode) {
  return "size=" + std::to_string(std::max(bytes, kMinTmpfsBytes)) + ",mode=" + octal(mode);
}

// The per-mount flags the kernel locks on mounts a user namespace inherits: a bind remount must
// repeat them or fails with EPERM. statvfs' ST_* values are not the MS_* ones (ST_RELATIME is
// MS_BIND's bit), so they are translated. Atime flags are left out on purpose: a remount that
// names none keeps the mount's own, which is exactly what the lock requires.
unsigned long locked_flags_of(const std::string& host_path, const std::string& where) {
  struct statvfs vfs {};
  if (statvfs(host_path.c_str(), &vfs) != 0)
    fail(where, "cannot read the mount flags of " + host_path + ": " + errno_text(errno));
  unsigned long flags = 0;
  if (vfs.f_flag & ST_RDONLY) flags |= MS_RDONLY;
  if (vfs.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (vfs.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (vfs.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  return flags;
}

// Undoes the octal escapes (\040 space, \011 tab, \012 newline, \134 backslash) of mountinfo.
std::string unescape_mountinfo(const std::string& field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    const auto is_octal = [&](std::size_t at) { return field[at] >= '0' && field[at] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && is_octal(i + 1) && is_octal(i + 2) &&
        is_octal(i + 3)) {
      out += static_cast<char>(std::stoi(field.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// Every mount point of the host's mount namespace with the lockable flags of that mount. A path
// mounted over several times keeps the last (topmost) entry: that is the one a path reaches.
std::map<std::string, unsigned long> read_host_mounts() {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) throw Error("cannot read /proc/self/mountinfo: " + errno_text(errno));
  std::map<std::string, unsigned long> mounts;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, options;
    if (!(fields >> id >> parent >> device >> root >> mount_point >> options)) continue;
    unsigned long flags = 0;
    std::istringstream list(options);
    for (std::string option; std::getline(list, option, ',');) {
      if (option == "ro") flags |= MS_RDONLY;
      if (option == "nosuid") flags |= MS_NOSUID;
      if (option == "nodev") flags |= MS_NODEV;
      if (option == "noexec") flags |= MS_NOEXEC;
    }
    mounts[unescape_mountinfo(mount_point)] = flags;
  }
  return mounts;
}

bool is_under(const std::string& path, const std::string& dir) {
  if (dir == "/") return path != "/";
  return path.size() > dir.size() && path.starts_with(dir) && path[dir.size()] == '/';
}

std::size_t depth_of(const std::string& path) {
  return static_cast<std::size_t>(std::count(path.begin(), path.end(), '/'));
}

// A sandbox path the plan can build: absolute, in normal form, not the root. Mount targets also
// stay out of the trees the sandbox provides itself.
void check_sandbox_path(const std::string& target, const std::string& where, bool is_mount) {
  if (target.empty() || target[0] != '/')
    fail(where, "must be an absolute path, got \"" + target + "\"");
  if (target == "/") fail(where, "must not be \"/\"; the sandbox root is always a fresh tmpfs");
  std::istringstream parts(target.substr(1));
  for (std::string part; std::getline(parts, part, '/');)
    if (part.empty() || part == "." || part == "..")
      fail(where,
           "must be written in normal form without '.', '..' or '//', got \"" + target + "\"");
  if (target.back() == '/') fail(where, "must not end in '/', got \"" + target + "\"");
  if (target == kOldRoot || is_under(target, kOldRoot))
    fail(where, std::string(kOldRoot) + " is reserved for building the sandbox");
  if (!is_mount) return;
  for (const char* owned : {"/proc", "/dev"})
    if (target == owned || is_under(target, owned))
      fail(where, std::string(owned) + " is built by the sandbox itself; mounts in it are not " +
                      "supported");
}

class Builder {
 public:
  explicit Builder(std::vector<RootfsPlan::Op>& ops) : ops_(ops) {}

  RootfsPlan::Op& add(RootfsPlan::Op op) {
    const std::size_t slash = op.path.rfind('/');
    if (slash != std::string::npos) {
      op.parent = slash == 0 ? "/" : op.path.substr(0, slash);
      op.leaf = op.path.substr(slash + 1);
    }
    return ops_.emplace_back(std::move(op));
  }

  void mount(std::string step, std::string source, std::string target, std::string fstype,
             unsigned long flags, std::string data = {}, bool unreachable_ok = false) {
    RootfsPlan::Op op;
    op.kind = RootfsPlan::Op::Kind::mount;
    op.step = std::move(step);
    op.source = std::move(source);
    op.path = std::move(target);
    op.fstype = std::move(fstype);
    op.flags = flags;
    op.data = std::move(data);
    op.unreachable_ok = unreachable_ok;
    add(std::move(op));
  }

  void remount(const std::string& target, unsigned long flags, bool unreachable_ok = false) {
    mount("remount " + target + describe(flags), {}, target, {}, MS_REMOUNT | MS_BIND | flags, {},
          unreachable_ok);
  }

  void mkdir(const std::string& path, mode_t mode, std::string step = {}) {
    if (made_.count(path)) return;
    made_.insert(path);
    RootfsPlan::Op op;
    op.kind = RootfsPlan::Op::Kind::mkdir;
    op.step = step.empty() ? "mkdir " + path : std::move(step);
    op.path = path;
    op.mode = mode;
    op.exists_ok = true;
    add(std::move(op));
  }

  // Every missing ancestor of `path` (not `path` itself).
  void mkdir_parents(const std::string& path, const std::string& step = {}) {
    for (std::size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1))
      mkdir(path.substr(0, slash), 0755, step);
  }

  void touch(const std::string& path) {
    RootfsPlan::Op op;
    op.kind = RootfsPlan::Op::Kind::touch;
    op.step = "create mount point " + path;
    op.path = path;
    op.mode = 0444;
    op.exists_ok = true;
    add(std::move(op));
  }

  void symlink(const std::string& contents, const std::string& path) {
    RootfsPlan::Op op;
    op.kind = RootfsPlan::Op::Kind::symlink;
    op.step = "symlink " + path + " -> " + contents;
    op.source = contents;
    op.path = path;
    add(std::move(op));
  }

  void write_file(const std::string& path, std::string contents, mode_t mode) {
    RootfsPlan::Op op;
    op.kind = RootfsPlan::Op::Kind::write_file;
    op.step = "write " + path;
    op.path = path;
    op.data = std::move(contents);
    op.mode = mode;
    add(std::move(op));
  }

  void simple(RootfsPlan::Op::Kind kind, std::string step, std::string path,
              std::string source = {}) {
    RootfsPlan::Op op;
    op.kind = kind;
    op.step = std::move(step);
    op.path = std::move(path);
    op.source = std::move(source);
    add(std::move(op));
  }

 private:
  static std::string describe(unsigned long flags) {
    std::string text;
    if (flags & MS_RDONLY) text += " ro";
    if (flags & MS_NOSUID) text += " nosuid";
    if (flags & MS_NODEV) text += " nodev";
    if (flags & MS_NOEXEC) text += " noexec";
    return text;
  }

  std::vector<RootfsPlan::Op>& ops_;
  std::set<std::string> made_;  // directories already created; mounts are ordered parent-first
};

// A bind source resolved on the host like realpath(3), except that a symlink is followed only when
// root or the runtime's own user owns it. Sandboxes run as other host uids (65534 when the
// runtime is root), so a link one of them planted in a directory it could write, through a
// read-write bind, is never followed into a later sandbox's view of the host. nullopt with errno
// set when a component is missing or unreadable; throws for a link it will not follow.
std::optional<std::string> resolve_host_source(const std::string& source,
                                               const std::string& where) {
  constexpr int kMaxLinks = 40;  // the kernel's own limit
  std::deque<std::string> rest;
  const auto push_front = [&](const std::string& path) {
    std::deque<std::string> parts;
    std::istringstream in(path);
    for (std::string part; std::getline(in, part, '/');)
      if (!part.empty() && part != ".") parts.push_back(part);
    rest.insert(rest.begin(), parts.begin(), parts.end());
  };
  push_front(source);
  std::string resolved;  // "" is "/"
  int links = 0;
  while (!rest.empty()) {
    const std::string part = std::move(rest.front());
    rest.pop_front();
    if (part == "..") {
      resolved.erase(resolved.empty() ? 0 : resolved.rfind('/'));
      continue;
    }
    const std::string next = resolved + "/" + part;
    struct stat info {};
    if (lstat(next.c_str(), &info) != 0) return std::nullopt;
    if (!S_ISLNK(info.st_mode)) {
      if (!rest.empty() && !S_ISDIR(info.st_mode)) {
        errno = ENOTDIR;
        return std::nullopt;
      }
      resolved = next;
      continue;
    }
    if (info.st_uid != 0 && info.st_uid != geteuid())
      fail(where, next + " is a symlink owned by uid " + std::to_string(info.st_uid) +
                      ", which a sandbox may have planted; a bind source follows only links "
                      "owned by root or by the runtime's user: bind the path it points to instead");
    if (++links > kMaxLinks) {
      errno = ELOOP;
      return std::nullopt;
    }
    char contents[PATH_MAX];
    const ssize_t length = readlink(next.c_str(), contents, sizeof contents);
    if (length < 0) return std::nullopt;
    if (length == static_cast<ssize_t>(sizeof contents)) {
      errno = ENAMETOOLONG;
      return std::nullopt;
    }
    const std::string target(contents, static_cast<std::size_t>(length));
    if (!target.empty() && target[0] == '/') resolved.clear();
    push_front(target);
  }
  return resolved.empty() ? "/" : resolved;
}

// A policy bind. `index` is its position in the policy, for messages.
void prepare_bind(Builder& build, const Mount& mount, std::size_t index,
                  const std::map<std::string, unsigned long>& host_mounts) {
  const std::string where = "filesystem.mounts[" + std::to_string(index) + "]";
  if (mount.source.empty() || mount.source[0] != '/')
    fail(where + ".source", "must be an absolute host path, got \"" + mount.source + "\"");

  struct stat link_info {};
  if (lstat(mount.source.c_str(), &link_info) != 0) {
    if (errno == ENOENT && mount.optional) return;
    fail(where + ".source", mount.source + (errno == ENOENT ? " does not exist on the host"
                                                            : ": " + errno_text(errno)));
  }
  // A symlink at the same place in the sandbox (/bin -> usr/bin, /lib64 -> usr/lib64) is
  // recreated as is, so the paths programs use resolve the same way inside. At another target a
  // relative link would point elsewhere, so the link is followed and its destination bound.
  if (S_ISLNK(link_info.st_mode) && mount.target == mount.source) {
    char contents[PATH_MAX];
    const ssize_t length = readlink(mount.source.c_str(), contents, sizeof contents);
    if (length < 0 || length == static_cast<ssize_t>(sizeof contents))
      fail(where + ".source", "cannot read the symlink " + mount.source);
    build.mkdir_parents(mount.target);
    build.symlink(std::string(contents, static_cast<std::size_t>(length)), mount.target);
    return;
  }

  // Intermediate symlinks are resolved here, on the host, because in the child the source is
  // reached through /.rlm-old-root, where an absolute link would resolve against the new root.
  // The child then refuses any symlink on the resolved path, so one planted in between fails the
  // run instead of redirecting the bind.
  const auto resolved = resolve_host_source(mount.source, where + ".source");
  if (!resolved) {
    if (errno == ENOENT && mount.optional) return;  // a dangling symlink
    fail(where + ".source", mount.source + ": " + errno_text(errno));
  }
  const std::string host_path = *resolved;
  struct stat info {};
  if (stat(host_path.c_str(), &info) != 0)
    fail(where + ".source", mount.source + ": " + errno_text(errno));

  build.mkdir_parents(mount.target);
  if (S_ISDIR(info.st_mode))
    build.mkdir(mount.target, 0755, "create mount point " + mount.target);
  else
    build.touch(mount.target);

  const std::string from = host_path == "/" ? kOldRoot : kOldRoot + host_path;
  build.mount("bind " + mount.target + (host_path == mount.target ? "" : " from " + host_path),
              from, mount.target, {}, MS_BIND | MS_REC);
  // A recursive bind copies the host's mounts below the source with their own flags, so each is
  // remounted too; otherwise a read-only /usr could hide a writable /usr/local.
  const unsigned long wanted = MS_NOSUID | MS_NODEV | (mount.readonly ? MS_RDONLY : 0);
  build.remount(mount.target, wanted | locked_flags_of(host_path, where + ".source"));
  for (const auto& [point, flags] : host_mounts) {
    if (!is_under(point, host_path)) continue;
    const std::string relative = host_path == "/" ? point : point.substr(host_path.size());
    build.remount(mount.target + relative, wanted | flags, /*unreachable_ok=*/true);
  }
}

void prepare_tmpfs(Builder& build, const Mount& mount, const Policy& policy) {
  const bool shared_tmp = mount.target == "/tmp" || mount.target == "/var/tmp";
  const std::uint64_t bytes = mount.size_bytes.value_or(policy.limits.tmpfs_bytes);
  build.mkdir_parents(mount.target);
  build.mkdir(mount.target, 0755, "create mount point " + mount.target);
  build.mount("mount tmpfs on " + mount.target, "tmpfs", mount.target, "tmpfs",
              MS_NOSUID | MS_NODEV | (mount.readonly ? MS_RDONLY : 0),
              tmpfs_options(bytes, shared_tmp ? 01777 : 0755));
}

// /dev: a small tmpfs with the host's harmless device nodes bound in, a private devpts, a
// size-capped /dev/shm and the usual links; read-only once built.
void prepare_dev(Builder& build, const Policy& policy) {
  build.mkdir("/dev", 0755);
  build.mount("mount tmpfs on /dev", "tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              tmpfs_options(kDevTmpfsBytes, 0755));
  for (const char* name : kDevices) {
    const std::string host = std::string("/dev/") + name;
    struct stat info {};
    if (stat(host.c_str(), &info) != 0 || !S_ISCHR(info.st_mode)) {
      if (std::strcmp(name, "null") == 0)
        throw Error("/dev/null is missing or not a character device on the host");
      continue;
    }
    build.touch(host);
    build.mount("bind " + host, kOldRoot + host, host, {}, MS_BIND);
    // Not nodev, of course: these are the device nodes.
    build.remount(host, MS_NOSUID | MS_NOEXEC | locked_flags_of(host, "/dev"));
  }
  build.mkdir("/dev/pts", 0755);
  // newinstance: the sandbox's own pty numbering, none of the host's terminals.
  build.mount("mount devpts on /dev/pts", "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620");
  build.symlink("pts/ptmx", "/dev/ptmx");
  build.mkdir("/dev/shm", 0755);
  build.mount("mount tmpfs on /dev/shm", "tmpfs", "/dev/shm", "tmpfs",
              MS_NOSUID | MS_NODEV | MS_NOEXEC, tmpfs_options(policy.limits.tmpfs_bytes, 01777));
  build.symlink("/proc/self/fd", "/dev/fd");
  build.symlink("/proc/self/fd/0", "/dev/stdin");
  build.symlink("/proc/self/fd/1", "/dev/stdout");
  build.symlink("/proc/self/fd/2", "/dev/stderr");
  build.remount("/dev", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
}

// /proc for the new PID namespace, with kernel internals masked and tunables read-only.
void prepare_proc(Builder& build) {
  build.mkdir("/proc", 0555);
  build.mount("mount proc on /proc", "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC);
  for (const char* name : kProcReadOnly) {
    const std::string path = std::string("/proc/") + name;
    struct stat info {};
    if (lstat(path.c_str(), &info) != 0) continue;
    build.mount("bind " + path + " onto itself", path, path, {}, MS_BIND | MS_REC);
    build.remount(path, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
  }
  for (const char* name : kProcMasked) {
    const std::string path = std::string("/proc/") + name;
    struct stat info {};
    if (lstat(path.c_str(), &info) != 0) continue;
    if (S_ISDIR(info.st_mode))
      build.mount("mask " + path, "tmpfs", path, "tmpfs",
                  MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, tmpfs_options(0, 0555));
    else
      build.mount("mask " + path, "/dev/null", path, {}, MS_BIND);
  }
}

// /etc/passwd and /etc/group: root, the sandbox user (named "sandbox", home = the workdir) and
// nobody, so tools that look the uid up (id, ssh, Python's getpass) find a name.
void prepare_etc(Builder& build, const Policy& policy, const std::string& home) {
  bool binds_passwd = false, binds_group = false;
  for (const Mount& mount : policy.filesystem.mounts) {
    binds_passwd |= mount.target == "/etc" || mount.target == "/etc/passwd";
    binds_group |= mount.target == "/etc" || mount.target == "/etc/group";
  }
  const std::uint32_t uid = policy.user.uid, gid = policy.user.gid;
  std::string passwd, group;
  if (uid != 0) passwd += "root:x:0:0:root:/root:/bin/sh\n";
  passwd += "sandbox:x:" + std::to_string(uid) + ":" + std::to_string(gid) + ":sandbox:" + home +
            ":/bin/sh\n";
  if (uid != 65534) passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
  if (gid != 0) group += "root:x:0:\n";
  group += "sandbox:x:" + std::to_string(gid) + ":\n";
  if (gid != 65534) group += "nogroup:x:65534:\n";
  if (!binds_passwd || !binds_group) build.mkdir("/etc", 0755);
  if (!binds_passwd) build.write_file("/etc/passwd", std::move(passwd), 0644);
  if (!binds_group) build.write_file("/etc/group", std::move(group), 0644);
}

}  // namespace

RootfsPlan RootfsPlan::prepare(const Policy& policy) {
  const auto& mounts = policy.filesystem.mounts;
  for (std::size_t i = 0; i < mounts.size(); ++i)
    check_sandbox_path(mounts[i].target, "filesystem.mounts[" + std::to_string(i) + "].target",
                       /*is_mount=*/true);
  const std::string workdir = policy.filesystem.workdir.empty() ? "/" : policy.filesystem.workdir;
  if (workdir != "/") check_sandbox_path(workdir, "filesystem.workdir", /*is_mount=*/false);

  struct stat staging {};
  if (lstat(kStaging, &staging) != 0 || !S_ISDIR(staging.st_mode))
    throw Error(std::string("the sandbox root is staged on ") + kStaging +
                ", which must be a directory on the host");

  RootfsPlan plan;
  Builder build(plan.ops_);
  build.mount("make every mount private", {}, "/", {}, MS_REC | MS_PRIVATE);
  build.mount("mount the root tmpfs", "tmpfs", kStaging, "tmpfs", MS_NOSUID | MS_NODEV,
              tmpfs_options(kRootTmpfsBytes, 0755));
  {
    Op op;
    op.kind = Op::Kind::mkdir;
    op.step = "mkdir the old root's mount point";
    op.path = std::string(kStaging) + "/" + kOldRootName;
    op.mode = 0700;
    build.add(std::move(op));
  }
  build.simple(Op::Kind::pivot_root, "pivot_root into the root tmpfs", kStaging, kOldRootName);

  // Parents before children (the policy validator demands that order already; a policy built
  // in code gets it here), otherwise policy order.
  std::vector<std::size_t> order(mounts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return depth_of(mounts[a].target) < depth_of(mounts[b].target);
  });
  std::map<std::string, unsigned long> host_mounts;
  if (std::any_of(mounts.begin(), mounts.end(),
                  [](const Mount& m) { return m.type == Mount::Type::bind; }))
    host_mounts = read_host_mounts();
  for (std::size_t index : order) {
    if (mounts[index].type == Mount::Type::bind)
      prepare_bind(build, mounts[index], index, host_mounts);
    else
      prepare_tmpfs(build, mounts[index], policy);
  }

  prepare_dev(build, policy);
  prepare_proc(build);
  prepare_etc(build, policy, policy.filesystem.workdir.empty() ? "/tmp" : workdir);

  // The workdir is created where missing; under a read-only mount that fails with EROFS, named.
  const std::string workdir_step = "create workdir " + workdir;
  if (workdir != "/") {
    build.mkdir_parents(workdir, workdir_step);
    build.mkdir(workdir, 0755, workdir_step);
  }

  build.simple(Op::Kind::detach, "detach the host root", kOldRoot);
  build.simple(Op::Kind::rmdir, "remove the old root's mount point", kOldRoot);
  build.remount("/", MS_RDONLY | MS_NOSUID | MS_NODEV);
  build.simple(Op::Kind::chdir, "chdir " + workdir, workdir);
  return plan;
}

namespace {

// ---- The child's side: raw syscalls only, no allocation (this runs between clone and exec). ----

// Keeps errno across the close() calls of cleanup.
void close_keeping_errno(int fd) noexcept {
  if (fd < 0) return;
  const int saved = errno;
  ::close(fd);
  errno = saved;
}

// `path` (absolute, in the new root) opened without following any symlink, magic links included,
// and without leaving `root`: ELOOP when a component is a link.
int open_in_root(int root, const char* path, int flags) noexcept {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how));
}

// "/.rlm-old-root/proc/self/fd/<fd>": a path mount(2) resolves to exactly what `fd` refers to
// (the host's procfs, reachable until the host root is detached; "self" is this process there).
struct FdPath {
  char text[64];
};
FdPath fd_path(int fd) noexcept {
  FdPath out{};
  constexpr char kPrefix[] = "/.rlm-old-root/proc/self/fd/";
  std::size_t at = 0;
  for (; kPrefix[at] != '\0'; ++at) out.text[at] = kPrefix[at];
  char digits[16];
  std::size_t count = 0;
  auto value = static_cast<unsigned>(fd);
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0 && count < sizeof digits);
  while (count > 0) out.text[at++] = digits[--count];
  out.text[at] = '\0';
  return out;
}

// The parent directory of an operation's path, opened in the new root.
class Parent {
 public:
  Parent(int root, const std::string& parent) noexcept
      : fd_(open_in_root(root, parent.c_str(), O_PATH | O_DIRECTORY)) {}
  ~Parent() { close_keeping_errno(fd_); }
  Parent(const Parent&) = delete;
  Parent& operator=(const Parent&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// An existing entry where the plan creates one: fine when it is a directory (or, for a file mount
// point, anything but one), never when it is a symlink.
bool existing_is(int dir, const char* name, bool want_directory) noexcept {
  struct stat info;
  if (::fstatat(dir, name, &info, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (S_ISLNK(info.st_mode)) {
    errno = ELOOP;
    return false;
  }
  if (S_ISDIR(info.st_mode) != want_directory) {
    errno = want_directory ? ENOTDIR : EISDIR;
    return false;
  }
  return true;
}

bool write_all(int fd, const std::string& contents) noexcept {
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

const char* or_null(const std::string& s) noexcept {
  return s.empty() ? nullptr : s.c_str();
}

}  // namespace

bool RootfsPlan::apply(StepFailure& failure) const noexcept {
  // Before pivot_root the paths are the host's own (/, /tmp); afterwards `root` is the new root
  // and every path is resolved inside it.
  int root = -1;

  // A mount whose source (binds) and target are opened in the new root first.
  auto mount_in_root = [&root](const Op& op) noexcept -> bool {
    const int target = open_in_root(root, op.path.c_str(), O_PATH);
    if (target < 0) return false;
    int source = -1;
    if ((op.flags & MS_BIND) && !(op.flags & MS_REMOUNT)) {
      source = open_in_root(root, op.source.c_str(), O_PATH);
      if (source < 0) {
        close_keeping_errno(target);
        return false;
      }
    }
    const FdPath target_path = fd_path(target);
    const FdPath source_path = fd_path(source);
    const int rc = ::mount(source >= 0 ? source_path.text : or_null(op.source), target_path.text,
                           or_null(op.fstype), op.flags, or_null(op.data));
    close_keeping_errno(source);
    close_keeping_errno(target);
    return rc == 0;
  };

  auto run = [&](const Op& op) noexcept -> bool {
    const char* path = op.path.c_str();
    switch (op.kind) {
      case Op::Kind::mount: {
        bool ok;
        if (root < 0 || op.path == "/")
          ok = ::mount(or_null(op.source), path, or_null(op.fstype), op.flags, or_null(op.data)) ==
               0;
        else
          ok = mount_in_root(op);
        return ok || (op.unreachable_ok && (errno == ENOENT || errno == EACCES || errno == EINVAL));
      }
      case Op::Kind::mkdir: {
        if (root < 0) return ::mkdir(path, op.mode) == 0 || (op.exists_ok && errno == EEXIST);
        const Parent dir(root, op.parent);
        if (dir.get() < 0) return false;
        if (::mkdirat(dir.get(), op.leaf.c_str(), op.mode) == 0) return true;
        return errno == EEXIST && op.exists_ok && existing_is(dir.get(), op.leaf.c_str(), true);
      }
      case Op::Kind::touch: {
        const Parent dir(root, op.parent);
        if (dir.get() < 0) return false;
        const int fd =
            ::openat(dir.get(), op.leaf.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, op.mode);
        if (fd >= 0) {
          ::close(fd);
          return true;
        }
        return errno == EEXIST && op.exists_ok && existing_is(dir.get(), op.leaf.c_str(), false);
      }
      case Op::Kind::symlink: {
        const Parent dir(root, op.parent);
        return dir.get() >= 0 && ::symlinkat(op.source.c_str(), dir.get(), op.leaf.c_str()) == 0;
      }
      case Op::Kind::write_file: {
        const Parent dir(root, op.parent);
        if (dir.get() < 0) return false;
        const int fd =
            ::openat(dir.get(), op.leaf.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, op.mode);
        if (fd < 0) return false;
        if (!write_all(fd, op.data)) {
          close_keeping_errno(fd);
          return false;
        }
        return ::close(fd) == 0;
      }
      case Op::Kind::pivot_root:
        // pivot_root(".", put_old) from inside the new root: both paths stay short and relative.
        if (::chdir(path) != 0 || ::syscall(SYS_pivot_root, ".", op.source.c_str()) != 0 ||
            ::chdir("/") != 0)
          return false;
        root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        return root >= 0;
      case Op::Kind::detach:
        return ::umount2(path, MNT_DETACH) == 0;
      case Op::Kind::rmdir:
        return ::rmdir(path) == 0;
      case Op::Kind::chdir: {
        if (root < 0) return ::chdir(path) == 0;
        const int dir = open_in_root(root, path, O_PATH | O_DIRECTORY);
        if (dir < 0) return false;
        const bool ok = ::fchdir(dir) == 0;
        close_keeping_errno(dir);
        return ok;
      }
    }
    errno = EINVAL;
    return false;
  };
  bool ok = true;
  for (const Op& op : ops_) {
    if (!run(op)) {
      failure.step = op.step.c_str();
      failure.error = errno;
      ok = false;
      break;
    }
  }
  close_keeping_errno(root);
  return ok;
}

}  // namespace rlm::ns
