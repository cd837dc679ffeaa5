#include "docker/stats_sampler.hpp"

#include <algorithm>

namespace rlm::docker {
namespace {

constexpr std::chrono::milliseconds kInterval{10};

void keep_largest(std::optional<std::uint64_t>& kept, const std::optional<std::uint64_t>& seen) {
  if (seen) kept = std::max(kept.value_or(0), *seen);
}

}  // namespace

StatsSampler::StatsSampler(std::optional<ContainerCgroup> cgroup) : cgroup_(std::move(cgroup)) {
  if (cgroup_) thread_ = std::thread([this] { loop(); });
}

void StatsSampler::take() {
  const auto reading = cgroup_->read();
  keep_largest(seen_.peak_memory_bytes, reading.peak_memory_bytes);
  keep_largest(seen_.cpu_nanoseconds, reading.cpu_nanoseconds);
  keep_largest(seen_.oom_kills, reading.oom_kills);
}

void StatsSampler::loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    take();
    wake_.wait_for(lock, kInterval, [this] { return stopping_; });
  }
}

CgroupReading StatsSampler::finish() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return seen_;
    stopping_ = true;
    if (cgroup_) take();  // a last look, in case the container is still there
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  return seen_;
}

}  // namespace rlm::docker
