// The limits and the usage report, on whatever cgroup version this host has: a child attached
// to the group while it waits hits the memory limit (OOM kill), the pids limit, and burns CPU.
#include <sys/mman.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <ctime>

#include "cgroup/files.hpp"
#include "cgroup_test_util.hpp"

namespace rlm::test {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

TEST(CgroupLimits, MemoryLimitOomKillsAndReportsPeak) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  WaitingChild child([] {
    // Touch 256 MiB page by page: the limit is hit long before the end.
    const std::size_t size = 256 * MiB;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 3;
    for (std::size_t off = 0; off < size; off += 4096) static_cast<char*>(p)[off] = 1;
    return 0;  // survived: the limit did not hold
  });
  group->attach(child.pid());
  child.release();
  const int status = child.wait();
  ASSERT_TRUE(WIFSIGNALED(status))
      << "child exited with " << WEXITSTATUS(status) << " instead of being OOM-killed";
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const auto usage = group->usage();
  EXPECT_TRUE(usage.oom_killed);
  EXPECT_TRUE(usage.memory_limit_hit);
  EXPECT_FALSE(usage.pids_limit_hit);
  // memory.peak needs kernel 5.19 on v2; v1 always has max_usage_in_bytes.
  if (usage.peak_memory_bytes || !is_cgroup2_host()) {
    ASSERT_TRUE(usage.peak_memory_bytes.has_value());
    EXPECT_GE(*usage.peak_memory_bytes, 48 * MiB);
    EXPECT_LE(*usage.peak_memory_bytes, 64 * MiB);
  }
  // Where the figures come from: on v2 memory.peak and memory.events' oom_kill; on v1
  // memory.max_usage_in_bytes and memory.oom_control's oom_kill.
  const std::string dir = dirs_of(*group)[0];
  if (is_cgroup2_host()) {
    EXPECT_EQ(usage.peak_memory_bytes, cgroup::cgfs::read_number(dir + "/memory.peak"));
    EXPECT_EQ(usage.oom_kills, cgroup::cgfs::read_key(dir + "/memory.events", "oom_kill"));
  } else {
    EXPECT_EQ(usage.peak_memory_bytes,
              cgroup::cgfs::read_number(dir + "/memory.max_usage_in_bytes"));
    EXPECT_EQ(usage.oom_kills, cgroup::cgfs::read_key(dir + "/memory.oom_control", "oom_kill"));
  }
  EXPECT_GE(usage.oom_kills, 1u);
}

TEST(CgroupLimits, UnderTheLimitNothingIsReported) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  WaitingChild child([] {
    const std::size_t size = 8 * MiB;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 3;
    std::memset(p, 1, size);
    return 0;
  });
  group->attach(child.pid());
  child.release();
  const int status = child.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const auto usage = group->usage();
  EXPECT_FALSE(usage.oom_killed);
  EXPECT_FALSE(usage.memory_limit_hit);
  EXPECT_FALSE(usage.pids_limit_hit);
  if (usage.peak_memory_bytes) {
    EXPECT_GE(*usage.peak_memory_bytes, 8 * MiB);
  }
}

TEST(CgroupLimits, PidsLimitStopsAForkFlood) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(256 * MiB, 16));
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  WaitingChild child([&] {
    // 100 forks, each child sleeping; count what the pids limit refused.
    int refused = 0;
    for (int i = 0; i < 100; ++i) {
      pid_t p = ::fork();
      if (p == 0) {
        for (;;) ::pause();
      }
      if (p < 0) ++refused;
    }
    (void)!::write(report[1], &refused, sizeof refused);
    return 0;  // the sleepers stay behind: the group's destructor must kill them
  });
  ::close(report[1]);
  group->attach(child.pid());
  child.release();
  int refused = -1;
  ASSERT_EQ(::read(report[0], &refused, sizeof refused), static_cast<ssize_t>(sizeof refused));
  ::close(report[0]);
  child.wait();
  EXPECT_EQ(refused, 100 - 15) << "16 pids: the forking child and 15 sleepers";
  EXPECT_TRUE(group->usage().pids_limit_hit);
  EXPECT_FALSE(group->usage().oom_killed);

  const auto dirs = dirs_of(*group);
  group.reset();  // 15 sleepers still inside
  for (const auto& dir : dirs) EXPECT_FALSE(dir_exists(dir)) << dir;
}

TEST(CgroupLimits, CpuUsageIsAccounted) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  EXPECT_EQ(group->usage().cpu.value_or(std::chrono::microseconds(0)).count(), 0)
      << "a fresh group has used no CPU";
  WaitingChild child([] {
    // ~200 ms of CPU time.
    timespec start{}, now{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    volatile unsigned long x = 0;
    do {
      for (int i = 0; i < 100000; ++i) x = x + i;
      ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < 200);
    return 0;
  });
  group->attach(child.pid());
  child.release();
  child.wait();
  const auto cpu = group->usage().cpu;
  ASSERT_TRUE(cpu.has_value()) << "no CPU accounting in " << group->describe();
  EXPECT_GE(cpu->count(), 150'000) << "microseconds";
  EXPECT_LT(cpu->count(), 10'000'000);
}

// Burns CPU in `workers` processes for `wall` of wall time each; async-signal-safe (a WaitingChild
// body).
int burn_in_parallel(int workers, std::chrono::milliseconds wall) {
  for (int i = 0; i < workers; ++i) {
    if (::fork() == 0) {
      timespec start{}, now{};
      ::clock_gettime(CLOCK_MONOTONIC, &start);
      volatile unsigned long x = 0;
      do {
        for (int k = 0; k < 100000; ++k) x = x + k;
        ::clock_gettime(CLOCK_MONOTONIC, &now);
      } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 <
               wall.count());
      ::_exit(0);
    }
  }
  while (::wait(nullptr) > 0) {
  }
  return 0;
}

// limits.cpus (issue 11 line 15): the quota is in the group's file, and the group's processes
// together get no more than that share of the wall time.
TEST(CgroupLimits, CpusSetsTheBandwidthAndHoldsIt) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16, 0.5));
  ASSERT_TRUE(group->cpu_bandwidth_limited()) << group->cpu_bandwidth_problem();
  EXPECT_EQ(group->cpu_bandwidth_problem(), "");
  std::string quota;
  for (const auto& dir : dirs_of(*group)) {
    if (is_cgroup2_host()) {
      quota = cgroup::cgfs::read_file(dir + "/cpu.max").value_or("");
    } else if (auto q = cgroup::cgfs::read_file(dir + "/cpu.cfs_quota_us")) {
      quota = *q + "/" + cgroup::cgfs::read_file(dir + "/cpu.cfs_period_us").value_or("?");
    }
  }
  EXPECT_EQ(quota, is_cgroup2_host() ? "50000 100000\n" : "50000\n/100000\n");

  WaitingChild child([] { return burn_in_parallel(2, std::chrono::milliseconds(1000)); });
  group->attach(child.pid());
  const auto start = std::chrono::steady_clock::now();
  child.release();
  child.wait();
  const auto wall = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  const auto cpu = group->usage().cpu;
  ASSERT_TRUE(cpu.has_value()) << "no CPU accounting in " << group->describe();
  // Two CPUs' worth of burning held to half of one: at most ~0.5 s per wall second, plus a
  // period's slack (unbounded, two burners use up to 2 s in the 1 s).
  EXPECT_LE(static_cast<double>(cpu->count()) / static_cast<double>(wall.count()), 0.6)
      << cpu->count() << " us of CPU in " << wall.count() << " us";
}

// Without limits.cpus nothing is throttled, and on v1 no group is made in the cpu hierarchy.
TEST(CgroupLimits, WithoutCpusThereIsNoQuota) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  EXPECT_FALSE(group->cpu_bandwidth_limited());
  EXPECT_EQ(group->cpu_bandwidth_problem(), "");
  for (const auto& dir : dirs_of(*group)) {
    if (is_cgroup2_host()) {
      if (auto max = cgroup::cgfs::read_file(dir + "/cpu.max")) {
        EXPECT_TRUE(max->starts_with("max ")) << *max;
      }
    } else if (auto quota = cgroup::cgfs::read_file(dir + "/cpu.cfs_quota_us")) {
      // Only where cpu shares a hierarchy with cpuacct ("cpu,cpuacct"); unlimited there.
      EXPECT_EQ(*quota, "-1\n") << dir;
    }
  }
}

// The CPU time of the whole group, however many processes shared it: what the supervision loop
// holds to limits.cpu_time_ms.
TEST(CgroupLimits, CpuTimeCountsEveryProcessTogether) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  WaitingChild child([] {
    // Four short-lived burners one after another, ~100 ms of CPU each.
    for (int i = 0; i < 4; ++i) {
      if (::fork() == 0) {
        timespec start{}, now{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
        volatile unsigned long x = 0;
        do {
          for (int k = 0; k < 100000; ++k) x = x + k;
          ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
        } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 <
                 100);
        ::_exit(0);
      }
      ::wait(nullptr);
    }
    return 0;
  });
  group->attach(child.pid());
  child.release();
  child.wait();
  const auto cpu = group->cpu_time();
  ASSERT_TRUE(cpu.has_value()) << "no CPU accounting in " << group->describe();
  EXPECT_GE(cpu->count(), 380'000) << "microseconds: every burner's time, not the last one's";
}

}  // namespace
}  // namespace rlm::test
