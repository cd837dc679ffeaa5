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
#include <fcntl.h>
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
#include <fstream>
#include <map>
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

// /proc entries hidden from the sandbox: kernel memory and addresses, the host's keyring
// metadata, scheduler and timer internals that leak other tenants' activity, page-frame maps,
// sysrq, and hardware directories. Files get /dev/null bound over them, directories an empty
// read-only tmpfs. Only those that exist on the host are masked.
constexpr const char* kProcMasked[] = {"kcore",       "kmsg",          "keys",       "key-users",
                                       "kallsyms",    "latency_stats", "timer_list", "timer_stats",
                                       "sched_debug", "kpagecount",    "kpageflags", "kpagecgroup",
                                       "config.gz",   "sysrq-trigger", "acpi",       "asound",
                                       "scsi",        "firmware",      "driver"};
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

  RootfsPlan::Op& add(RootfsPlan::Op op) { return ops_.emplace_back(std::move(op)); }

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
  char resolved[PATH_MAX];
  if (!realpath(mount.source.c_str(), resolved)) {
    if (errno == ENOENT && mount.optional) return;  // a dangling symlink
    fail(where + ".source", mount.source + ": " + errno_text(errno));
  }
  const std::string host_path = resolved;
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

bool RootfsPlan::apply(StepFailure& failure) const noexcept {
  // Only thin syscall wrappers below: this runs between clone and exec.
  auto run = [](const Op& op) noexcept -> bool {
    const char* path = op.path.c_str();
    auto or_null = [](const std::string& s) noexcept { return s.empty() ? nullptr : s.c_str(); };
    switch (op.kind) {
      case Op::Kind::mount:
        if (::mount(or_null(op.source), path, or_null(op.fstype), op.flags, or_null(op.data)) == 0)
          return true;
        return op.unreachable_ok && (errno == ENOENT || errno == EACCES || errno == EINVAL);
      case Op::Kind::mkdir:
        return ::mkdir(path, op.mode) == 0 || (op.exists_ok && errno == EEXIST);
      case Op::Kind::touch: {
        struct stat info;
        if (op.exists_ok && ::lstat(path, &info) == 0 && !S_ISDIR(info.st_mode)) return true;
        const int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, op.mode);
        if (fd < 0) return false;
        ::close(fd);
        return true;
      }
      case Op::Kind::symlink:
        return ::symlink(op.source.c_str(), path) == 0;
      case Op::Kind::write_file: {
        const int fd =
            ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, op.mode);
        if (fd < 0) return false;
        const char* data = op.data.data();
        std::size_t left = op.data.size();
        while (left > 0) {
          const ssize_t n = ::write(fd, data, left);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            const int error = n < 0 ? errno : EIO;
            ::close(fd);
            errno = error;
            return false;
          }
          data += n;
          left -= static_cast<std::size_t>(n);
        }
        return ::close(fd) == 0;
      }
      case Op::Kind::pivot_root:
        // pivot_root(".", put_old) from inside the new root: both paths stay short and relative.
        return ::chdir(path) == 0 && ::syscall(SYS_pivot_root, ".", op.source.c_str()) == 0 &&
               ::chdir("/") == 0;
      case Op::Kind::detach:
        return ::umount2(path, MNT_DETACH) == 0;
      case Op::Kind::rmdir:
        return ::rmdir(path) == 0;
      case Op::Kind::chdir:
        return ::chdir(path) == 0;
    }
    errno = EINVAL;
    return false;
  };
  for (const Op& op : ops_) {
    if (!run(op)) {
      failure.step = op.step.c_str();
      failure.error = errno;
      return false;
    }
  }
  return true;
}

}  // namespace rlm::ns
