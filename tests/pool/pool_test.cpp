// rlm::Pool's warm run sandboxes against the real kernel: nothing of one pooled run is visible to
// the next, a request's tighter limits hold in a sandbox built before it, a looser one is
// refused, a drained pool runs cold, many threads share a pool, the caller's fds as the payload's
// stdio, and a destroyed pool leaves nothing behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <thread>

#include "../namespace/namespace_backend_test_util.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/pool.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

bool cgroups_here() {
  const auto health = ns::make_namespace_backend()->health();
  const auto& enforced = health.enforced;
  return std::find(enforced.begin(), enforced.end(), "limits.pids") != enforced.end();
}

// Waits (up to 20 s) until the pool holds `count` ready sandboxes.
bool wait_ready(const Pool& pool, std::size_t count) {
  const auto until = Clock::now() + 20s;
  while (pool.stats().ready_sandboxes < count) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

Result pooled_sh(Pool& pool, const std::string& script, Request request = {}) {
  request.argv = {"sh", "-c", script};
  return pool.run(request);
}

TEST(Pool, NothingOfOneRunIsVisibleToTheNext) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  ASSERT_TRUE(wait_ready(pool, 1));
  // A file in /tmp, a process that left the session, a variable, a tighter memory limit.
  Policy tight = pool.policy();
  tight.limits.memory_bytes = 48ull << 20;
  Request first;
  first.argv = {
      "sh", "-c",
      "echo left > /tmp/marker; n=64.97; setsid sleep ${n}31 </dev/null >/dev/null 2>&1 & "
      "export SEEN=1; echo $RLM_POOL_TEST; sleep 0.2"};
  first.env = {{"RLM_POOL_TEST", "first"}};
  const auto one = pool.run(first, tight);
  ASSERT_EQ(one.status, Status::ok) << describe(one);
  EXPECT_EQ(one.stdout_data, "first\n");
  EXPECT_TRUE(processes_with_cmdline("sleep 64.9731").empty()) << "outlived its run";

  ASSERT_TRUE(wait_ready(pool, 1));
  const auto two = pooled_sh(
      pool,
      "test -e /tmp/marker && echo file || echo no-file; echo ${RLM_POOL_TEST-unset} "
      "${SEEN-unset}; "
      "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[s]leep 64' || true");
  ASSERT_EQ(two.status, Status::ok) << describe(two);
  EXPECT_EQ(two.stdout_data, "no-file\nunset unset\n0\n");
  EXPECT_EQ(pool.stats().warm_runs, 2u);
  EXPECT_EQ(pool.stats().cold_runs, 0u);

  if (!cgroups_here()) return;
  // The first run's tighter memory limit is gone with its sandbox: 64 MiB fit in the next one.
  ASSERT_TRUE(wait_ready(pool, 1));
  const auto roomy = pooled_sh(pool, "head -c 64M /dev/zero | tail > /dev/null && echo fits");
  EXPECT_EQ(roomy.status, Status::ok) << describe(roomy);
  EXPECT_EQ(roomy.stdout_data, "fits\n");
  EXPECT_EQ(pool.stats().warm_runs, 3u);
}

TEST(Pool, TighterLimitsHoldInAWarmSandbox) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  if (cgroups_here()) {
    Policy memory = pool.policy();
    memory.limits.memory_bytes = 48ull << 20;
    ASSERT_TRUE(wait_ready(pool, 1));
    Request balloon;
    balloon.argv = {"sh", "-c", "head -c 1G /dev/zero | tail"};
    const auto oom = pool.run(balloon, memory);
    EXPECT_EQ(oom.status, Status::memory_limit) << describe(oom);
    EXPECT_LE(oom.peak_memory_bytes, 56ull << 20) << describe(oom);

    Policy pids = pool.policy();
    pids.limits.pids = 8;
    ASSERT_TRUE(wait_ready(pool, 1));
    Request forks;
    forks.argv = {"sh", "-c", "for i in $(seq 30); do sleep 5 & done; wait"};
    const auto fork_limited = pool.run(forks, pids);
    EXPECT_EQ(fork_limited.status, Status::pids_limit) << describe(fork_limited);
  }

  Policy wall = pool.policy();
  wall.limits.wall_time = 400ms;
  ASSERT_TRUE(wait_ready(pool, 1));
  Request slow;
  slow.argv = {"sleep", "30"};
  const auto start = Clock::now();
  const auto timed_out = pool.run(slow, wall);
  EXPECT_EQ(timed_out.status, Status::timeout) << describe(timed_out);
  EXPECT_LT(Clock::now() - start, 5s);
  // The wall time is the payload's, counted from its release: not below the limit.
  EXPECT_GE(timed_out.wall, 400ms);
  EXPECT_EQ(pool.stats().cold_runs, 0u) << "every run above was served warm";
}

TEST(Pool, ALooserRequestIsRefused) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  Policy looser = pool.policy();
  looser.limits.memory_bytes *= 2;
  Request request;
  request.argv = {"true"};
  try {
    pool.run(request, looser);
    ADD_FAILURE() << "a looser memory limit ran";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("limits.memory_bytes"), std::string::npos)
        << error.what();
  }
  Policy no_bandwidth = pool.policy();
  no_bandwidth.limits.cpus = 0.5;
  Policy base_with_cpus = pool.policy();
  base_with_cpus.limits.cpus = 0.25;
  Pool limited(base_with_cpus, {.sandboxes = 0});
  EXPECT_THROW(limited.run(request, no_bandwidth), Error);
  EXPECT_EQ(pool.stats().warm_runs + pool.stats().cold_runs, 0u);
}

TEST(Pool, OtherPoliciesAndADrainedPoolRunCold) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  ASSERT_TRUE(wait_ready(pool, 1));
  // Another hostname is not a limit: no warm sandbox was built for it.
  Policy other = pool.policy();
  other.hostname = "elsewhere";
  Request request;
  request.argv = {"cat", "/proc/sys/kernel/hostname"};
  const auto elsewhere = pool.run(request, other);
  EXPECT_EQ(elsewhere.stdout_data, "elsewhere\n") << describe(elsewhere);
  EXPECT_EQ(pool.stats().cold_runs, 1u);
  EXPECT_EQ(pool.stats().ready_sandboxes, 1u) << "the warm one is still there";

  // Four runs at once on a pool of one: one is warm, the others do not wait for the refill.
  std::barrier start(4);
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      start.arrive_and_wait();
      const auto result = pooled_sh(pool, "echo ran");
      if (result.status == Status::ok && result.stdout_data == "ran\n") ++good;
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good.load(), 4);
  const auto stats = pool.stats();
  EXPECT_EQ(stats.warm_runs + stats.cold_runs, 5u);
  EXPECT_GE(stats.warm_runs, 1u);
  EXPECT_GE(stats.cold_runs, 2u) << "a drained pool runs cold";
}

TEST(Pool, ASandboxWhoseInitWasKilledIsNotUsed) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  ASSERT_TRUE(wait_ready(pool, 1));
  // The only children of this process are the pool's waiting inits (PID 1 of their sandboxes).
  const auto waiting = children_of_this_process();
  ASSERT_EQ(waiting.size(), 1u);
  ASSERT_EQ(kill(waiting.front(), SIGKILL), 0);
  std::this_thread::sleep_for(50ms);
  const auto result = pooled_sh(pool, "echo ran");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "ran\n");
  EXPECT_EQ(pool.stats().warm_runs, 0u) << "the dead sandbox served no run";
  EXPECT_EQ(pool.stats().cold_runs, 1u);
}

TEST(Pool, FourThreadsShareAPool) {
  const auto fds = open_fd_count();
  {
    Pool pool(ns_policy(), {.sandboxes = 2});
    std::vector<std::thread> threads;
    std::vector<std::string> failures(4);
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 5; ++i) {
          Request request;
          request.argv = {"cat"};
          request.stdin_data = "thread " + std::to_string(t) + " run " + std::to_string(i) + "\n";
          const auto result = pool.run(request);
          if (result.status != Status::ok || result.stdout_data != request.stdin_data)
            failures[static_cast<std::size_t>(t)] = describe(result);
        }
      });
    for (auto& thread : threads) thread.join();
    for (const auto& failure : failures) EXPECT_EQ(failure, "");
    const auto stats = pool.stats();
    EXPECT_EQ(stats.warm_runs + stats.cold_runs, 20u);
    EXPECT_GE(stats.warm_runs, 1u);
  }
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_TRUE(own_cgroup_dirs().empty());
}

// The payload writes to the caller's pipes itself: nothing of it is in the Result.
void expect_output_in_callers_pipes(const std::function<Result(const Request&)>& run) {
  int out[2], err[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  Request request;
  request.argv = {"sh", "-c", "echo to-out; echo to-err >&2; cat; exit 3"};
  request.payload_stdio = {null_fd, out[1], err[1]};
  const auto result = run(request);
  close(out[1]);
  close(err[1]);
  close(null_fd);
  EXPECT_EQ(result.status, Status::exit_nonzero) << describe(result);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.stdout_data, "");
  EXPECT_EQ(result.stderr_data, "");
  EXPECT_EQ(read_to_eof(out[0]), "to-out\n");
  EXPECT_EQ(read_to_eof(err[0]), "to-err\n");
  close(out[0]);
  close(err[0]);
}

TEST(Pool, ThePayloadsStdioCanBeTheCallersFds) {
  Pool pool(ns_policy(), {.sandboxes = 1});
  ASSERT_TRUE(wait_ready(pool, 1));
  expect_output_in_callers_pipes([&](const Request& request) { return pool.run(request); });
  EXPECT_EQ(pool.stats().warm_runs, 1u);
  // Cold, on the namespace backend and the local one.
  const auto ns_backend = ns::make_namespace_backend();
  expect_output_in_callers_pipes(
      [&](const Request& request) { return ns_backend->run(request, ns_policy()); });
  const auto local = make_backend("local");
  Policy unisolated = ns_policy();
  unisolated.filesystem.workdir = "";
  expect_output_in_callers_pipes(
      [&](const Request& request) { return local->run(request, unisolated); });

  // Together with the other ways of feeding or reading the payload, it is an error.
  Request both;
  both.argv = {"true"};
  both.payload_stdio = {0, 1, 2};
  both.stdin_data = "x";
  EXPECT_THROW(pool.run(both), Error);
  Request partial;
  partial.argv = {"true"};
  partial.payload_stdio = {0, 1, -1};
  EXPECT_THROW(ns_backend->run(partial, ns_policy()), Error);
  // A container cannot take the caller's fds: the docker backend says so before anything starts.
  if (const auto docker = make_backend("docker")) {
    Request fds;
    fds.argv = {"true"};
    fds.payload_stdio = {0, 1, 2};
    try {
      docker->run(fds, ns_policy());
      ADD_FAILURE() << "the docker backend took payload_stdio";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("not supported"), std::string::npos) << error.what();
    }
  }
}

TEST(Pool, DestroyingAPoolLeavesNothing) {
  isolate_mount_table();
  const auto fds = open_fd_count();
  const auto mounts = mount_table();
  {
    Pool pool(ns_policy(), {.sandboxes = 3});
    ASSERT_TRUE(wait_ready(pool, 3));
    const auto result = pooled_sh(pool, "n=65.12; setsid sleep ${n}34 & echo ok");
    EXPECT_EQ(result.stdout_data, "ok\n") << describe(result);
    ASSERT_TRUE(wait_ready(pool, 3));
    EXPECT_FALSE(children_of_this_process().empty()) << "three inits wait for a payload";
    EXPECT_FALSE(own_cgroup_dirs().empty());
  }
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_TRUE(own_cgroup_dirs().empty()) << own_cgroup_dirs().front();
  EXPECT_TRUE(processes_with_cmdline("sleep 65.1234").empty());
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_EQ(mount_table_since(mounts), mounts);
}

}  // namespace
}  // namespace rlm::test
