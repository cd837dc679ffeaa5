// cgroups for one sandboxed run: v2 (unified) or v1 (memory, pids, cpuacct and, for a CPU
// bandwidth limit, cpu hierarchies). The namespace backend runs every sandbox in one; the docker
// backend reads its containers' counters with the same reader (usage.hpp) and names them with the
// same run ids (run_id.hpp).
// Created in the parent before clone, joined by the child before it execs, read after the run,
// and removed with everything in them. Every group lives under a parent named "rlm-sandbox";
// nothing else on the host is ever touched, except in cgroups that are ours on v2: memory and
// pids (and cpu, for limits.cpus) are enabled in the cgroup.subtree_control of our own cgroup when
// it is the root, or of a cgroup delegated to us, and a busy delegated cgroup of ours is split
// into a leaf (v2_parent.cpp, docs/cgroups.md).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cgroup/usage.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::cgroup {

// What this host offers, for `health` and for the Result when limits fall back to rlimits.
// Found by really creating (and removing) a group with default limits. docs/cgroups.md.
struct CgroupSupport {
  enum class Mode { v2, v1, none } mode = Mode::none;
  std::string detail;  // "cgroup v1: memory and pids limits ... under /sys/fs/cgroup/memory/..."
                       // or, with mode none, why no group could be made
  std::string fix;     // with mode none: what gives a writable/delegated cgroup; else empty
  std::vector<std::string> enforced;  // policy fields enforced through cgroups here
  // Fields a group here does not enforce although the host has cgroups, and why (limits.cpus
  // without a cpu controller or CFS bandwidth; limits.cpu_time_ms without CPU accounting).
  std::map<std::string, std::string> missing;
  std::vector<std::string> parents;  // the rlm-sandbox parent directories runs go under
};
CgroupSupport probe_cgroups();

class RunCgroup;

// What RunCgroup::create() gives: the run's group, or none and why this host gives none (with
// "; to fix: ..." when there is a fix).
struct CreatedCgroup {
  std::unique_ptr<RunCgroup> group;
  std::string problem;  // "" when `group` is set
};

class RunCgroup {
 public:
  // Creates the run's group(s) with the memory limit (no swap), pids.max and, when limits.cpus is
  // set, the CPU bandwidth (v2 cpu.max; v1 cpu.cfs_quota_us per cpu.cfs_period_us). Gives no
  // group, and the problem, when this host gives no usable cgroup; the caller then falls back to
  // rlimits and says so. A bandwidth the host cannot give does not fail the creation:
  // cpu_bandwidth_problem() says why. Never throws; leaves nothing behind on failure. Thread-safe.
  static CreatedCgroup create(const Limits& limits);

  // Kills every member, waits (bounded: ~2 s, then up to 5 s per directory) for the kernel to let
  // go of them, and rmdirs the group(s). Never throws; a group that cannot be removed in time is
  // left for collect_stale_groups() of a later process.
  virtual ~RunCgroup() = default;
  RunCgroup() = default;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;

  // v2: a directory fd (O_CLOEXEC, owned by this object) for clone3's CLONE_INTO_CGROUP: the
  // child starts inside its limits, and a CLONE_NEWCGROUP in the same clone3 has the group as
  // its root. -1 on v1, where attach() is used instead.
  virtual int clone_into_fd() const = 0;
  // Moves `pid` into the group(s) (every hierarchy on v1); called by the parent while the child
  // waits, before it execs or unshares its cgroup namespace. Throws Error (e.g. ESRCH).
  virtual void attach(pid_t pid) = 0;
  // v1: write-only fds (owned by this object, O_CLOEXEC) of each group's `tasks` file, so the
  // cloned child can move itself by writing "0" to each before it changes its ids. A process
  // moving itself alone skips the kernel's global threadgroup lock, whose RCU grace period made
  // a move by the parent (attach) stall for up to ~30 ms on busy hosts. Empty on v2 (clone3's
  // CLONE_INTO_CGROUP does better). Opened on first call; throws Error when one cannot be.
  virtual std::vector<int> self_join_fds() { return {}; }
  // Cheap reads of the control files (usage.hpp); valid while the object lives (after kill_all
  // too).
  virtual CgroupUsage usage() const = 0;
  // Just the OOM-kill count, in one read: a session asks before every cell.
  virtual std::uint64_t oom_kills() const = 0;
  // Just the CPU time of the whole group, in one read: a session's cell clock asks it often, and
  // the supervision loop against limits.cpu_time_ms. nullopt without CPU accounting (a v1 host
  // without the cpuacct hierarchy).
  virtual std::optional<std::chrono::microseconds> cpu_time() const = 0;
  // Whether limits.cpus holds for this group: its quota was written. False when the limits had
  // none, or when this host cannot give one; then cpu_bandwidth_problem() says why.
  virtual bool cpu_bandwidth_limited() const = 0;
  virtual std::string cpu_bandwidth_problem() const = 0;
  // Kills every process in the group and waits (bounded, ~2 s) until it is empty; the group
  // stays for usage(). cgroup.kill on v2 (5.14+), else a pidfd kill loop that converges because
  // pids.max bounds every fork flood.
  virtual void kill_all() = 0;
  virtual std::string describe() const = 0;  // its paths, for messages
  // Lowers the group's memory (no swap) and pids limits to `limits`', and its CPU bandwidth where
  // the group has one (cpu_bandwidth_limited()) and `limits` sets cpus: a warm sandbox's request
  // tightening its policy, written before the payload starts. The caller has checked that no
  // limit rises. Throws Error naming the file that could not be written.
  virtual void tighten(const Limits& limits) = 0;
  // A recycled sandbox's next run in the same group: its counters count from now
  // (UsageReader::begin_next_run; called once the next init is in, before its payload), and on v2
  // page cache the last run left charged beyond a bound is reclaimed. False where that cannot be
  // done: the group is not for another run then.
  virtual bool begin_next_run() { return false; }
  // Whether no process is in the group (every hierarchy's): a recycled sandbox's group is, between
  // its last init's reaping and the next init.
  virtual bool empty() const { return false; }
};

// Removes groups under the rlm-sandbox parents whose owning runtime process is gone (e.g. it was
// SIGKILLed mid-run), killing anything left in them. Only names that parse as run ids of a dead
// owner in this PID namespace are touched. Safe to call concurrently; never throws. Called once
// per process by the backend before its first run.
void collect_stale_groups();

}  // namespace rlm::cgroup
