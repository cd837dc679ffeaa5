// Peak memory, CPU time and OOM kills of a one-shot container, read from its cgroup on this host
// (cgroup/usage.hpp; found from the container's PID 1, UsageReader::of_process). Its cgroup (and
// with it the kernel's own counters) is gone once it exits, so a thread reads them while it runs,
// every 10 ms (a few file reads each); the last reading before the exit stands for the whole run.
// A run shorter than that may report nothing ("where available"). The same readings hold the
// container to its CPU time: once it has used `cpu_budget`, limit_fd() becomes readable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "cgroup/usage.hpp"
#include "host/unique_fd.hpp"

namespace rlm::docker {

// A container's counters; empty fields once the cgroup is gone (the container exited) or a file
// is missing.
struct CgroupReading {
  std::optional<std::uint64_t> peak_memory_bytes;  // v1 max_usage_in_bytes, v2 memory.peak
  std::optional<std::uint64_t> cpu_nanoseconds;    // the whole container's CPU time
  std::optional<std::uint64_t> oom_kills;          // processes the OOM killer took in it
};

class StatsSampler {
 public:
  // Samples nothing when `cgroup` is empty (limit_fd() then never becomes readable).
  StatsSampler(std::optional<cgroup::UsageReader> cgroup, std::chrono::milliseconds cpu_budget);
  ~StatsSampler() { finish(); }
  StatsSampler(const StatsSampler&) = delete;
  StatsSampler& operator=(const StatsSampler&) = delete;

  // Stops sampling; returns the largest value of each counter seen.
  CgroupReading finish();
  // An eventfd, readable once the container's CPU time reached the budget; owned by the sampler.
  int limit_fd() const { return limit_.get(); }

 private:
  void loop();
  void take();

  std::optional<cgroup::UsageReader> cgroup_;
  std::uint64_t cpu_budget_ns_;
  host::UniqueFd limit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  CgroupReading seen_;
  std::thread thread_;
};

}  // namespace rlm::docker
