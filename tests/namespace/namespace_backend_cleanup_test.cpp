// Nothing outlives a run of the namespace backend: no process (even a setsid double fork), no fd,
// no child, no cgroup, no mount -- over many runs, from many threads, and when the runtime itself
// is killed mid-run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

#include "namespace_backend_test_util.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

// Waits up to `limit` for no process to match `needle`.
bool gone_within(const std::string& needle, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (!processes_with_cmdline(needle).empty()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

TEST(NamespaceBackendCleanup, ASetsidDoubleForkLeavesNothingAlive) {
  TempDir dir;
  Policy policy = ns_policy();
  bind_writable(policy, dir, "/out");
  // The daemon leaves the payload's session and process group and is reparented to init; the
  // payload exits at once. The daemon proves it ran by writing a file on the host.
  const auto start = Clock::now();
  const auto result = run_sh(
      "setsid sh -c 'echo started > /out/daemon; exec sleep 61.2468' </dev/null "
      ">/dev/null 2>&1 & sleep 0.3; exit 0",
      policy);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(dir.read("daemon"), "started\n");
  EXPECT_TRUE(processes_with_cmdline("sleep 61.2468").empty());
}

TEST(NamespaceBackendCleanup, ManyRunsLeaveNoFdChildCgroupOrMount) {
  // Mounts are compared in a table only this process and its runs change (see host_probes.hpp).
  isolate_mount_table();
  const auto fds = open_fd_count();
  const auto mounts = mount_table();
  for (int i = 0; i < 50; ++i) {
    const auto result = run_sh(i % 2 ? "echo $((1 + 1))" : "sleep 5 & echo $((1 + 1))");
    ASSERT_EQ(result.status, Status::ok) << i << ": " << describe(result);
    ASSERT_EQ(result.stdout_data, "2\n");
  }
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_TRUE(own_cgroup_dirs().empty()) << own_cgroup_dirs().front();
  EXPECT_EQ(mount_table_since(mounts), mounts);
}

TEST(NamespaceBackendCleanup, FailedSetupsLeaveNothingEither) {
  const auto fds = open_fd_count();
  Policy policy = ns_policy();
  policy.hostname = std::string(100, 'h');  // fails in the child, after the clone
  Mount missing;
  missing.source = "/nonexistent/rlm-sandbox-test";
  missing.target = "/data";
  Policy bad_mount = ns_policy();
  bad_mount.filesystem.mounts.push_back(missing);
  for (int i = 0; i < 10; ++i) {
    const auto result = run_ns({"true"}, i % 2 ? policy : bad_mount);
    EXPECT_NE(result.status, Status::ok) << describe(result);
  }
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_TRUE(own_cgroup_dirs().empty());
}

TEST(NamespaceBackendCleanup, RunsFromEightThreadsAtOnce) {
  const auto fds = open_fd_count();
  std::atomic<int> good{0};
  std::vector<std::string> failures(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &good, &failures] {
      for (int i = 0; i < 5; ++i) {
        Request request;
        request.stdin_data = "thread " + std::to_string(t) + " run " + std::to_string(i) + "\n";
        const auto result = run_ns({"cat"}, ns_policy(), request);
        if (result.status == Status::ok && result.stdout_data == request.stdin_data)
          ++good;
        else
          failures[static_cast<std::size_t>(t)] = describe(result);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good.load(), 40);
  for (const auto& failure : failures) EXPECT_EQ(failure, "");
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_TRUE(own_cgroup_dirs().empty());
}

TEST(NamespaceBackendCleanup, KillingTheRuntimeKillsTheSandbox) {
  // The runtime (here the CLI) dies without any chance to clean up; its sandbox's PID 1 gets the
  // parent-death signal, and the kernel takes the whole PID namespace with it.
  const std::string cli = bin_path("rlm-sandbox");
  const pid_t runtime = fork();
  ASSERT_GE(runtime, 0);
  if (runtime == 0) {
    // The number is assembled inside, so only the sleeps themselves match.
    execl(cli.c_str(), cli.c_str(), "run", "--", "sh", "-c",
          "n=62.13; setsid sleep ${n}57 & exec sleep ${n}57", static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto until = Clock::now() + 10s;
  while (processes_with_cmdline("sleep 62.1357").size() < 2 && Clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(processes_with_cmdline("sleep 62.1357").size(), 2u);
  kill(runtime, SIGKILL);
  waitpid(runtime, nullptr, 0);
  EXPECT_TRUE(gone_within("sleep 62.1357", 5s));
}

}  // namespace
}  // namespace rlm::test
