// Peak memory, CPU time and OOM kills of a one-shot container. Its cgroup (and with it the
// kernel's own counters) is gone once it exits, so a thread reads them while it runs, every
// 10 ms (a few file reads each); the last reading before the exit stands for the whole run. A run
// shorter than that may report nothing ("where available").
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "docker/container_cgroup.hpp"

namespace rlm::docker {

class StatsSampler {
 public:
  // Samples nothing when `cgroup` is empty.
  explicit StatsSampler(std::optional<ContainerCgroup> cgroup);
  ~StatsSampler() { finish(); }
  StatsSampler(const StatsSampler&) = delete;
  StatsSampler& operator=(const StatsSampler&) = delete;

  // Stops sampling; returns the largest value of each counter seen.
  CgroupReading finish();

 private:
  void loop();
  void take();

  std::optional<ContainerCgroup> cgroup_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  CgroupReading seen_;
  std::thread thread_;
};

}  // namespace rlm::docker
