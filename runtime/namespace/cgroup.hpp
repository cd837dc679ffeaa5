// cgroups for one sandboxed run: v2 (unified) or v1 (memory, pids, cpu/cpuacct hierarchies).
// Created in the parent before clone, joined by the child before it execs, read after the run,
// and removed with everything in them. Every group lives under a parent named "rlm-sandbox";
// nothing else on the host is ever touched.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::ns {

// What this host offers, for `health` and for the Result when limits fall back to rlimits.
struct CgroupSupport {
  enum class Mode { v2, v1, none } mode = Mode::none;
  std::string detail;                  // "cgroup v1: memory, pids, cpu at /sys/fs/cgroup/..."
  std::string fix;                     // the command that gives a writable/delegated cgroup
  std::vector<std::string> enforced;   // policy fields enforced through cgroups here
};
CgroupSupport probe_cgroups();

// What the run consumed and which cgroup limit stopped it, read after the payload is gone.
struct CgroupUsage {
  std::optional<std::uint64_t> peak_memory_bytes;  // memory.peak / memory.max_usage_in_bytes
  std::optional<std::chrono::microseconds> cpu;    // cpu.stat usage_usec / cpuacct.usage
  bool oom_killed = false;         // memory.events oom_kill / memory.oom_control oom_kill
  bool memory_limit_hit = false;   // the limit was reached at all (failcnt / events max)
  bool pids_limit_hit = false;     // pids.events max
};

class RunCgroup {
 public:
  // Creates the run's group(s) with memory.max (+ swap 0), pids.max and, when the policy asks,
  // a CPU quota. Returns nullptr and sets `why` when this host has no writable cgroup (the caller
  // then falls back to rlimits and says so). Throws Error only for a broken hierarchy.
  static std::unique_ptr<RunCgroup> create(const Limits& limits, std::string* why);

  virtual ~RunCgroup() = default;  // implementations kill every member and rmdir the group(s)
  RunCgroup() = default;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;

  // v2: a directory fd for clone3's CLONE_INTO_CGROUP (the child starts inside its limits).
  // -1 on v1, where attach() is used instead.
  virtual int clone_into_fd() const = 0;
  // Moves `pid` into the group(s); called by the parent while the child waits, before it execs.
  virtual void attach(pid_t pid) = 0;
  virtual CgroupUsage usage() const = 0;
  // Kills every process in the group (cgroup.kill on v2; freeze-free kill loop on v1).
  virtual void kill_all() = 0;
  virtual std::string describe() const = 0;  // its paths, for messages
};

// Removes groups under the rlm-sandbox parents whose owning runtime process is gone (e.g. it was
// SIGKILLed mid-run), killing anything left in them. Safe to call concurrently; touches nothing
// outside the rlm-sandbox parents. Called once per process by the backend before its first run.
void collect_stale_groups();

}  // namespace rlm::ns
