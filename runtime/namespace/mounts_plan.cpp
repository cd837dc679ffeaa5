// RootfsPlan::prepare(): the sandbox's root filesystem as a flat list of operations, built in the
// parent from the policy and what it finds on the host (mounts_host.cpp); apply() replays them in
// the cloned child (mounts_apply.cpp). docs/namespace-rootfs.md describes the resulting tree.
//
// The shape of the plan, in the child's private mount namespace:
//   1. everything made private, so nothing propagates back to the host;
//   2. a small tmpfs is mounted on /tmp and becomes the root at once (pivot_root), with the host
//      root kept under /.rlm-old-root. Every bind is then taken from /.rlm-old-root/<source>, so
//      sources anywhere (including under /tmp, which the staging tmpfs covered) stay reachable;
//   3. the policy's mounts, /dev, /proc (masked), /etc/passwd and /etc/group, the workdir;
//   4. the host root is detached, / remounted read-only, the cwd set to the workdir.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "namespace/mounts.hpp"
#include "policy/python_environment.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {

RootfsPlan::RootfsPlan() = default;
RootfsPlan::~RootfsPlan() = default;
RootfsPlan::RootfsPlan(RootfsPlan&&) noexcept = default;
RootfsPlan& RootfsPlan::operator=(RootfsPlan&&) noexcept = default;

namespace {

// Where the new root is staged before the first pivot_root, and where the host root then sits
// until it is detached.
constexpr const char* kStaging = "/tmp";
constexpr const char* kOldRootName = kOldRoot + 1;  // ".rlm-old-root"

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

std::string octal(mode_t mode) {
  std::ostringstream out;
  out << std::oct << mode;
  return out.str();
}

std::string tmpfs_options(std::uint64_t bytes, mode_t mode) {
  return "size=" + std::to_string(std::max(bytes, kMinTmpfsBytes)) + ",mode=" + octal(mode);
}

// A tmpfs mounted by the host's root for a recycled sandbox (prepare_refresh): owned by the
// sandbox uid's host ids, as the one its own child mounts is.
std::string tmpfs_options(std::uint64_t bytes, mode_t mode, uid_t owner, gid_t group) {
  return tmpfs_options(bytes, mode) + ",uid=" + std::to_string(owner) +
         ",gid=" + std::to_string(group);
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
    fail_at(where, "must be an absolute path, got \"" + target + "\"");
  if (target == "/") fail_at(where, "must not be \"/\"; the sandbox root is always a fresh tmpfs");
  std::istringstream parts(target.substr(1));
  for (std::string part; std::getline(parts, part, '/');)
    if (part.empty() || part == "." || part == "..")
      fail_at(where,
              "must be written in normal form without '.', '..' or '//', got \"" + target + "\"");
  if (target.back() == '/') fail_at(where, "must not end in '/', got \"" + target + "\"");
  if (target == kOldRoot || is_under(target, kOldRoot))
    fail_at(where, std::string(kOldRoot) + " is reserved for building the sandbox");
  if (!is_mount) return;
  for (const char* owned : {"/proc", "/dev"})
    if (target == owned || is_under(target, owned))
      fail_at(where, std::string(owned) + " is built by the sandbox itself; mounts in it are not " +
                         "supported");
}

class Builder {
 public:
  Builder(std::vector<RootfsPlan::Op>& ops, std::vector<RootfsPlan::Reach>& reach)
      : ops_(ops), reach_(reach) {}

  // Records what the sandbox reaches at `path` once the tree is built (RootfsPlan::reach).
  void reach(std::string path, RootfsPlan::Reach::Kind kind) {
    reach_.push_back({std::move(path), kind});
  }

  RootfsPlan::Op& add(RootfsPlan::Op op) {
    const std::size_t slash = op.path.rfind('/');
    if (slash != std::string::npos) {
      op.parent = slash == 0 ? "/" : op.path.substr(0, slash);
      op.leaf = op.path.substr(slash + 1);
    }
    op.sandbox_built = sandbox_built_;
    return ops_.emplace_back(std::move(op));
  }

  // Marks the operations added while it lives as RootfsPlan::Op::sandbox_built.
  class SandboxBuilt {
   public:
    explicit SandboxBuilt(Builder& build) : build_(build) { build_.sandbox_built_ = true; }
    ~SandboxBuilt() { build_.sandbox_built_ = false; }
    SandboxBuilt(const SandboxBuilt&) = delete;
    SandboxBuilt& operator=(const SandboxBuilt&) = delete;

   private:
    Builder& build_;
  };

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

  // The last operation (a bind) binds a read-write policy mount.
  void mark_writable_bind(const std::string& where, const std::string& host_path) {
    ops_.back().writable_bind_at = where;
    ops_.back().host_source = host_path;
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
  std::vector<RootfsPlan::Reach>& reach_;
  std::set<std::string> made_;  // directories already created; mounts are ordered parent-first
  bool sandbox_built_ = false;
};
// A policy bind. `where` is its JSON path, for messages.
void prepare_bind(Builder& build, const Mount& mount, const std::string& where,
                  const std::map<std::string, unsigned long>& host_mounts) {
  if (mount.source.empty() || mount.source[0] != '/')
    fail_at(where + ".source", "must be an absolute host path, got \"" + mount.source + "\"");

  struct stat link_info {};
  if (lstat(mount.source.c_str(), &link_info) != 0) {
    if (errno == ENOENT && mount.optional) return;
    fail_at(where + ".source", mount.source + (errno == ENOENT ? " does not exist on the host"
                                                               : ": " + sys::errno_text(errno)));
  }
  // A symlink at the same place in the sandbox (/bin -> usr/bin, /lib64 -> usr/lib64) is
  // recreated as is, so the paths programs use resolve the same way inside. At another target a
  // relative link would point elsewhere, so the link is followed and its destination bound.
  if (S_ISLNK(link_info.st_mode) && mount.target == mount.source) {
    char contents[PATH_MAX];
    const ssize_t length = readlink(mount.source.c_str(), contents, sizeof contents);
    if (length < 0 || length == static_cast<ssize_t>(sizeof contents))
      fail_at(where + ".source", "cannot read the symlink " + mount.source);
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
    fail_at(where + ".source", mount.source + ": " + sys::errno_text(errno));
  }
  const std::string host_path = *resolved;
  struct stat info {};
  if (stat(host_path.c_str(), &info) != 0)
    fail_at(where + ".source", mount.source + ": " + sys::errno_text(errno));

  build.mkdir_parents(mount.target);
  if (S_ISDIR(info.st_mode))
    build.mkdir(mount.target, 0755, "create mount point " + mount.target);
  else
    build.touch(mount.target);

  const std::string from = host_path == "/" ? kOldRoot : kOldRoot + host_path;
  build.mount("bind " + mount.target + (host_path == mount.target ? "" : " from " + host_path),
              from, mount.target, {}, MS_BIND | MS_REC);
  if (!mount.readonly) build.mark_writable_bind(where, host_path);
  build.reach(mount.target, mount.readonly ? RootfsPlan::Reach::Kind::read_exec
                                           : RootfsPlan::Reach::Kind::writable);
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
  build.reach(mount.target, mount.readonly ? RootfsPlan::Reach::Kind::read_exec
                                           : RootfsPlan::Reach::Kind::writable);
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
  build.reach("/dev", RootfsPlan::Reach::Kind::device);
}

// /proc for the new PID namespace, with kernel internals masked and tunables read-only.
constexpr unsigned long kProcFlags = MS_NOSUID | MS_NODEV | MS_NOEXEC;

// The kernel internals masked and the tunables read-only, on the proc mounted at /proc.
void mask_proc(Builder& build) {
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

void prepare_proc(Builder& build) {
  build.mkdir("/proc", 0555);
  build.mount("mount proc on /proc", "proc", "/proc", "proc", kProcFlags);
  build.reach("/proc", RootfsPlan::Reach::Kind::proc);
  mask_proc(build);
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
  if (!binds_passwd) {
    build.write_file("/etc/passwd", std::move(passwd), 0644);
    build.reach("/etc/passwd", RootfsPlan::Reach::Kind::read);
  }
  if (!binds_group) {
    build.write_file("/etc/group", std::move(group), 0644);
    build.reach("/etc/group", RootfsPlan::Reach::Kind::read);
  }
}

}  // namespace

RootfsPlan RootfsPlan::prepare(const Policy& policy, const std::vector<GeneratedFile>& files) {
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
  Builder build(plan.ops_, plan.reach_);
  build.reach("/", Reach::Kind::list);
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
  // The Python environment's directories: read-only binds at their host paths, after the
  // policy's mounts (the policy's check keeps them from hiding one), parents first.
  auto python = policy::python_dirs(policy);
  std::erase_if(python, [](const policy::PythonDir& dir) { return dir.bound_by_policy; });
  std::stable_sort(python.begin(), python.end(),
                   [](const policy::PythonDir& a, const policy::PythonDir& b) {
                     return depth_of(a.path) < depth_of(b.path);
                   });
  std::map<std::string, unsigned long> host_mounts;
  if (!python.empty() || std::any_of(mounts.begin(), mounts.end(),
                                     [](const Mount& m) { return m.type == Mount::Type::bind; }))
    host_mounts = read_host_mounts();
  for (std::size_t index : order) {
    const std::string where = "filesystem.mounts[" + std::to_string(index) + "]";
    if (mounts[index].type == Mount::Type::bind)
      prepare_bind(build, mounts[index], where, host_mounts);
    else
      prepare_tmpfs(build, mounts[index], policy);
  }
  for (const auto& dir : python) {
    Mount mount;
    mount.source = mount.target = dir.path;
    prepare_bind(build, mount, dir.where, host_mounts);
  }

  {
    // Checked by check_sandbox_path: no policy mount reaches into these two trees.
    const Builder::SandboxBuilt own_trees(build);
    prepare_dev(build, policy);
    prepare_proc(build);
  }
  prepare_etc(build, policy, policy.filesystem.workdir.empty() ? "/tmp" : workdir);
  for (const auto& file : files) {
    for (std::size_t i = 0; i < mounts.size(); ++i)
      if (file.path == mounts[i].target || file.path.starts_with(mounts[i].target + "/"))
        fail_at(file.asked_by, "the runtime writes " + file.path + ", which filesystem.mounts[" +
                                   std::to_string(i) + "] (" + mounts[i].target +
                                   ") covers; to fix: mount narrower paths there");
    build.mkdir_parents(file.path);
    build.write_file(file.path, file.contents, 0444);
    build.reach(file.path, Reach::Kind::read);
  }

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

}  // namespace rlm::ns

namespace rlm::ns {

std::string RootfsPlan::refresh_problem(const Policy& policy) {
  for (std::size_t i = 0; i < policy.filesystem.mounts.size(); ++i) {
    const Mount& mount = policy.filesystem.mounts[i];
    if (mount.type != Mount::Type::tmpfs || mount.readonly) continue;
    // Remounted by the host's root on a path no sandbox can have changed: a mount point on the
    // read-only root tmpfs itself. Deeper, a component could be a link the last run planted.
    if (mount.target.find('/', 1) != std::string::npos)
      return "filesystem.mounts[" + std::to_string(i) + "]: a writable tmpfs at " + mount.target +
             " is not directly under /, so it cannot be made fresh for the next run";
  }
  return {};
}

RootfsPlan RootfsPlan::prepare_refresh(const Policy& policy, uid_t owner, gid_t group) {
  if (auto problem = refresh_problem(policy); !problem.empty()) throw Error(problem);
  RootfsPlan plan;
  std::vector<Reach> unused;
  Builder build(plan.ops_, unused);
  // Every path here is one no sandbox can write: /proc and /dev/shm are mount points on the
  // read-only /dev and root tmpfs, and so are the writable tmpfs mounts (refresh_problem).
  const Builder::SandboxBuilt own_trees(build);
  // The kernel mounts a proc in a user namespace's mount namespace only while another proc is
  // fully visible there: the new one is mounted on /dev/shm's mount point before the last run's
  // /proc goes, then moved to /proc.
  build.simple(Op::Kind::detach, "detach the last run's /dev/shm", "/dev/shm");
  build.mount("mount proc (on /dev/shm's mount point)", "proc", "/dev/shm", "proc", kProcFlags);
  build.simple(Op::Kind::detach, "detach the last run's /proc", "/proc");
  build.mount("move the new proc to /proc", "/dev/shm", "/proc", {}, MS_MOVE);
  mask_proc(build);
  build.mount("mount a fresh tmpfs on /dev/shm", "tmpfs", "/dev/shm", "tmpfs",
              MS_NOSUID | MS_NODEV | MS_NOEXEC,
              tmpfs_options(policy.limits.tmpfs_bytes, 01777, owner, group));
  for (const Mount& mount : policy.filesystem.mounts) {
    if (mount.type != Mount::Type::tmpfs || mount.readonly) continue;
    const bool shared_tmp = mount.target == "/tmp" || mount.target == "/var/tmp";
    build.simple(Op::Kind::detach, "detach the last run's " + mount.target, mount.target);
    build.mount("mount a fresh tmpfs on " + mount.target, "tmpfs", mount.target, "tmpfs",
                MS_NOSUID | MS_NODEV,
                tmpfs_options(mount.size_bytes.value_or(policy.limits.tmpfs_bytes),
                              shared_tmp ? 01777 : 0755, owner, group));
  }
  return plan;
}

RootfsPlan RootfsPlan::prepare_refresh_workdir(const Policy& policy) {
  RootfsPlan plan;
  std::vector<Reach> unused;
  Builder build(plan.ops_, unused);
  const Builder::SandboxBuilt own_trees(build);  // as in prepare_refresh
  const std::string workdir = policy.filesystem.workdir.empty() ? "/" : policy.filesystem.workdir;
  // The workdir, where it lies in a fresh tmpfs, is made again, by the sandbox uid as at first.
  for (const Mount& mount : policy.filesystem.mounts)
    if (mount.type == Mount::Type::tmpfs && !mount.readonly && is_under(workdir, mount.target)) {
      build.mkdir_parents(workdir, "create workdir " + workdir);
      build.mkdir(workdir, 0755, "create workdir " + workdir);
    }
  build.simple(Op::Kind::chdir, "chdir " + workdir, workdir);
  return plan;
}

}  // namespace rlm::ns
