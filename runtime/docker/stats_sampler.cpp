#include "docker/stats_sampler.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace rlm::docker {
namespace {

constexpr std::chrono::milliseconds kInterval{10};

void keep_largest(std::optional<std::uint64_t>& kept, const std::optional<std::uint64_t>& seen) {
  if (seen) kept = std::max(kept.value_or(0), *seen);
}

CgroupReading read_counters(const cgroup::UsageReader& cgroup) {
  CgroupReading reading;
  reading.peak_memory_bytes = cgroup.peak_memory_bytes();
  reading.oom_kills = cgroup.oom_kills();
  if (const auto cpu = cgroup.cpu_time())
    reading.cpu_nanoseconds = static_cast<std::uint64_t>(cpu->count()) * 1000;
  return reading;
}

}  // namespace

StatsSampler::StatsSampler(std::optional<cgroup::UsageReader> cgroup,
                           std::chrono::milliseconds cpu_budget)
    : cgroup_(std::move(cgroup)),
      cpu_budget_ns_(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(cpu_budget).count())),
      limit_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!limit_) throw std::system_error(errno, std::generic_category(), "eventfd");
  if (cgroup_) thread_ = std::thread([this] { loop(); });
}

void StatsSampler::take() {
  const auto reading = read_counters(*cgroup_);
  keep_largest(seen_.peak_memory_bytes, reading.peak_memory_bytes);
  keep_largest(seen_.cpu_nanoseconds, reading.cpu_nanoseconds);
  keep_largest(seen_.oom_kills, reading.oom_kills);
  if (reading.cpu_nanoseconds && *reading.cpu_nanoseconds >= cpu_budget_ns_) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t ignored = ::write(limit_.get(), &one, sizeof one);
  }
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
