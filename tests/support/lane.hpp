// Which host setup ("lane") a test run is in, and how much repetition it can afford. The lanes
// are the setups users run on (docs/cgroups.md): tests/lanes/run-lane sets RLM_TEST_LANE, and
// tests/vm runs the cgroup v2 lanes in a VM, where code runs ~10x slower under emulation and
// RLM_TEST_SCALE (a fraction) cuts the repeat-heavy tests down.
#pragma once

#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <linux/magic.h>

namespace rlm::test {

inline bool cgroup2_mounted() {
  struct statfs fs {};
  return ::statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC;
}

// "root-cgroup-v1", "root-cgroup-v2", "user-delegated-cgroup-v2" or "user-no-cgroup". Without
// RLM_TEST_LANE: root gets the cgroup version mounted here; an ordinary user is assumed to have
// a delegated subtree on v2 and no cgroup on v1.
inline std::string test_lane() {
  if (const char* lane = std::getenv("RLM_TEST_LANE"); lane != nullptr && *lane != '\0')
    return lane;
  const bool v2 = cgroup2_mounted();
  if (::geteuid() == 0) return v2 ? "root-cgroup-v2" : "root-cgroup-v1";
  return v2 ? "user-delegated-cgroup-v2" : "user-no-cgroup";
}

// Whether this lane enforces memory and pids through cgroups (else rlimits stand in).
inline bool lane_has_cgroups() {
  return test_lane() != "user-no-cgroup";
}

// `count` repetitions, scaled by RLM_TEST_SCALE when set (at least 1).
inline int scaled(int count) {
  const char* scale = std::getenv("RLM_TEST_SCALE");
  if (scale == nullptr || *scale == '\0') return count;
  return std::max(1, static_cast<int>(count * std::atof(scale)));
}

}  // namespace rlm::test
