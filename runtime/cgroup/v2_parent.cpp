// cgroup v2: where the "rlm-sandbox" parent goes, and the controllers it passes to the runs' groups
// (memory and pids always; cpu for a run with limits.cpus, where the base offers it). In order:
//  1. below our own cgroup (nested, so the caller's own limits still apply). Works when our
//     cgroup is the hierarchy root, or already passes memory and pids down. Elsewhere the
//     "no internal processes" rule stops it: a non-root cgroup that holds processes -- ours holds
//     this one -- cannot enable controllers for its children (EBUSY).
//  2. beside our cgroup, in its parent, when that parent is delegated to us (systemd's
//     user.delegate/trusted.delegate xattr, or owned by our non-root uid): the layout systemd's
//     DelegateSubgroup= produces, where the unit's processes sit in a leaf.
//  3. at the hierarchy root, as root, when the root already passes memory and pids down (it
//     does on every systemd host). We never write the host's root subtree_control unless the
//     root is our own cgroup (1).
// When none works and our own cgroup is busy but ours to arrange -- delegated to us (what
// `systemd-run --scope -p Delegate=yes` hands over), or the root of a container's cgroup
// namespace -- every process in it moves into <own>/leaf, which frees <own> to pass controllers
// down: the layout of 2. A cgroup that is not ours is never rearranged.
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>

#include "cgroup/files.hpp"
#include "cgroup/group.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::cgroup {
namespace {

enum class Kind { own, delegated_parent, root };
struct Candidate {
  std::string base;
  Kind kind;
};

std::vector<Candidate> candidates(const HostCgroups& host) {
  std::vector<Candidate> out;
  const std::string& top = host.v2->mount_point;
  if (!host.v2_own.empty()) {
    out.push_back({host.v2_own, Kind::own});
    if (host.v2_own != top) {
      out.push_back({host.v2_own.substr(0, host.v2_own.rfind('/')), Kind::delegated_parent});
    }
  }
  if (host.v2_own != top && host.v2->root == "/") out.push_back({top, Kind::root});
  return out;
}

bool xattr_says_delegated(const std::string& dir, const char* name) {
  char value[8] = {};
  ssize_t n = ::getxattr(dir.c_str(), name, value, sizeof value - 1);
  return n > 0 && value[0] == '1';
}

bool delegated_to_us(const std::string& dir) {
  if (::access((dir + "/cgroup.procs").c_str(), W_OK) != 0) return false;
  if (xattr_says_delegated(dir, "trusted.delegate") || xattr_says_delegated(dir, "user.delegate"))
    return true;
  // Without the xattr (older systemd, manual delegation): a non-root owner is the delegate.
  struct stat st {};
  if (::geteuid() == 0 || ::stat(dir.c_str(), &st) != 0) return false;
  return st.st_uid == ::geteuid() && ::access((dir + "/cgroup.procs").c_str(), W_OK) == 0 &&
         ::access((dir + "/cgroup.subtree_control").c_str(), W_OK) == 0;
}

enum class Problem { none, busy, denied, unavailable, vanished };
struct Outcome {
  Problem problem = Problem::none;
  std::string text;
};

// Makes sure `dir`'s children get memory and pids, enabling them when `may_write`.
Outcome pass_down(const std::string& dir, bool may_write) {
  if (!cgfs::exists(dir + "/cgroup.subtree_control")) return {Problem::vanished, dir + " vanished"};
  const auto enabled = cgfs::read_words(dir + "/cgroup.subtree_control");
  const auto available = cgfs::read_words(dir + "/cgroup.controllers");
  for (const char* c : {"memory", "pids"}) {
    if (cgfs::contains(enabled, c)) continue;
    if (!cgfs::contains(available, c)) {
      // An unreadable list: the directory went away after the check above.
      if (!cgfs::exists(dir + "/cgroup.controllers")) return {Problem::vanished, dir + " vanished"};
      return {Problem::unavailable, std::string(c) + " is not available in " + dir +
                                        " (its parent does not pass it down)"};
    }
    if (!may_write) {
      return {Problem::unavailable,
              std::string(c) + " is not enabled in " + dir + "/cgroup.subtree_control"};
    }
    int err = cgfs::write_file(dir + "/cgroup.subtree_control", std::string("+") + c);
    if (err == ENOENT) return {Problem::vanished, dir + " vanished"};
    if (err == EBUSY) {
      return {Problem::busy, dir + " holds processes, so cgroup v2 cannot enable " + c +
                                 " for groups below it (the no-internal-processes rule)"};
    }
    if (err != 0) {
      return {
          err == EACCES || err == EPERM || err == EROFS ? Problem::denied : Problem::unavailable,
          "cannot enable " + std::string(c) + " in " + dir +
              "/cgroup.subtree_control: " + sys::errno_text(err)};
    }
  }
  return {};
}

// The cpu controller, for limits.cpus, is best effort: enabled in `dir` for its children when
// `dir` offers it and we may write there. A group without it still enforces memory and pids, and
// says that its bandwidth limit is missing. Only a vanished `dir` is a problem (a race to retry).
Outcome pass_down_cpu(const std::string& dir, bool may_write) {
  if (cgfs::contains(cgfs::read_words(dir + "/cgroup.subtree_control"), "cpu")) return {};
  if (!may_write || !cgfs::contains(cgfs::read_words(dir + "/cgroup.controllers"), "cpu"))
    return {};
  if (cgfs::write_file(dir + "/cgroup.subtree_control", "+cpu") == ENOENT)
    return {Problem::vanished, dir + " vanished"};
  return {};
}

Outcome try_base(const Candidate& c, bool want_cpu, std::string& parent) {
  if (c.kind == Kind::delegated_parent && !delegated_to_us(c.base)) {
    return {Problem::denied, c.base + " is not delegated to this user"};
  }
  if (c.kind == Kind::root && ::geteuid() != 0) {
    return {Problem::denied, "only root may use the top of the hierarchy " + c.base};
  }
  if (auto out = pass_down(c.base, c.kind != Kind::root); out.problem != Problem::none) return out;
  if (want_cpu) {
    if (auto out = pass_down_cpu(c.base, c.kind != Kind::root); out.problem != Problem::none)
      return out;
  }
  parent = c.base + "/" + kParentName;
  if (int err = cgfs::make_dir(parent)) {
    return {err == EACCES || err == EPERM || err == EROFS ? Problem::denied : Problem::unavailable,
            "cannot create " + parent + ": " + sys::errno_text(err)};
  }
  Outcome out = pass_down(parent, true);
  // The base passes memory and pids down (checked above), so a parent of ours that lacks them is
  // one being removed by another run's teardown right now (a dying cgroup's files read empty).
  if (out.problem == Problem::unavailable) out.problem = Problem::vanished;
  if (out.problem == Problem::none && want_cpu) out = pass_down_cpu(parent, true);
  return out;
}

// Our busy own cgroup, when we may move its processes: delegated to us, or (as root) the top of
// our view of the hierarchy while it is not the real root -- the real root never says EBUSY, so
// this is a container's cgroup namespace, whose processes are all the container's.
bool may_rearrange(const HostCgroups& host, const std::string& own) {
  return delegated_to_us(own) || (::geteuid() == 0 && own == host.v2->mount_point);
}

// Moves every process of `own` into <own>/leaf, until none is left (they may fork meanwhile).
Outcome move_into_leaf(const std::string& own) {
  const std::string leaf = own + "/" + kLeafName;
  if (int err = cgfs::make_dir(leaf)) {
    return {Problem::denied, "cannot create " + leaf + ": " + sys::errno_text(err)};
  }
  for (int round = 0; round < 100; ++round) {
    const auto pids = cgfs::members(own);
    if (pids.empty()) return {};
    for (pid_t pid : pids) {
      int err = cgfs::write_file(leaf + "/cgroup.procs", std::to_string(pid));
      if (err != 0 && err != ESRCH) {
        return {Problem::denied, "cannot move process " + std::to_string(pid) + " from " + own +
                                     " into " + leaf + ": " + sys::errno_text(err)};
      }
    }
  }
  return {Problem::busy, own + " keeps filling with new processes"};
}

}  // namespace

std::string v2_fix(const HostCgroups& host, bool busy) {
  const std::string run =
      "systemd-run" + std::string(::geteuid() == 0 ? "" : " --user") +
      " --pty --same-dir --wait --collect -p Delegate=yes -p DelegateSubgroup=supervisor "
      "rlm-sandbox ... (systemd 254+; see docs/cgroups.md)";
  if (::geteuid() == 0) {
    return "enable the controllers at the top of the hierarchy (echo '+memory +pids' > " +
           host.v2->mount_point +
           "/cgroup.subtree_control), or run rlm-sandbox in a delegated "
           "unit whose processes sit in a sub-group: " +
           run;
  }
  return std::string(busy ? "the cgroup this process runs in also holds processes; " : "") +
         "run rlm-sandbox in a cgroup delegated to you, with its processes in a sub-group: " + run;
}

std::string prepare_v2_parent(const HostCgroups& host, bool want_cpu, CgroupFailure& failure) {
  std::string reasons;
  bool busy = false, own_busy = false;
  for (const auto& c : candidates(host)) {
    std::string parent;
    Outcome out = try_base(c, want_cpu, parent);
    if (out.problem == Problem::none) return parent;
    if (out.problem == Problem::vanished) {
      failure.raced = true;
      return "";
    }
    busy = busy || out.problem == Problem::busy;
    own_busy = own_busy || (c.kind == Kind::own && out.problem == Problem::busy);
    reasons += (reasons.empty() ? "" : "; ") + out.text;
  }
  // The no-internal-processes rule, on a cgroup that is ours: make it a unit with a leaf.
  if (own_busy && may_rearrange(host, host.v2_own)) {
    Outcome moved = move_into_leaf(host.v2_own);
    std::string parent;
    if (moved.problem == Problem::none)
      moved = try_base({host.v2_own, Kind::own}, want_cpu, parent);
    if (moved.problem == Problem::none) return parent;
    if (moved.problem == Problem::vanished) {
      failure.raced = true;
      return "";
    }
    reasons += "; " + moved.text;
  }
  if (reasons.empty()) reasons = "this process's cgroup is not visible in " + host.v2->mount_point;
  failure.why = "cgroup v2: no usable cgroup for the sandbox: " + reasons;
  failure.fix = v2_fix(host, busy);
  return "";
}

std::vector<std::string> v2_parent_dirs(const HostCgroups& host) {
  std::vector<std::string> out;
  if (!host.v2) return out;
  for (const auto& c : candidates(host)) {
    std::string dir = c.base + "/" + kParentName;
    if (!cgfs::contains(out, dir)) out.push_back(dir);
  }
  return out;
}

}  // namespace rlm::cgroup
