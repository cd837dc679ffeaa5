// Nothing is left behind: no fd, no zombie, no descendant -- across many runs, from many threads,
// when the payload's main process exits early, and when the host itself dies mid-run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

#include "local_test_util.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

TEST(LocalCleanup, NoFdLeakAndNoZombieAcross50Runs) {
  run_local({"true"});  // first-use allocations (locale, etc.) are not leaks
  const auto fds_before = open_fd_count();
  Policy quick = local_policy();
  quick.limits.wall_time = 100ms;
  for (int i = 0; i < 50; ++i) {
    Request request;
    request.stdin_data = "line " + std::to_string(i) + "\n";
    switch (i % 5) {
      case 0:
        EXPECT_EQ(run_local({"cat"}, local_policy(), request).stdout_data, request.stdin_data);
        break;
      case 1:
        EXPECT_EQ(run_sh("exit 4").exit_code, 4);
        break;
      case 2:
        EXPECT_EQ(run_sh("sleep 5", quick).status, Status::timeout);
        break;
      case 3:
        EXPECT_EQ(run_local({"no-such-command-rlm"}).exit_code, 127);
        break;
      case 4:
        EXPECT_EQ(run_sh("sleep 30 & echo bg").status, Status::ok);
        break;
    }
  }
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_TRUE(children_of_this_process().empty());
}

TEST(LocalCleanup, DescendantsDieWhenTheMainProcessExits) {
  TempDir dir;
  const auto start = Clock::now();
  auto result = run_sh("setsid sh -c 'echo $$ > " + dir.file("daemon.pid") +
                       "; exec sleep 60' & while [ ! -s " + dir.file("daemon.pid") +
                       " ]; do sleep 0.01; done; echo main done");
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "main done\n");
  EXPECT_LT(Clock::now() - start, 2s) << "a background process holding stdout must not delay";
  const pid_t daemon = std::stoi(dir.read("daemon.pid"));
  EXPECT_FALSE(process_alive(daemon)) << "daemon " << daemon << " survived its parent";
}

TEST(LocalCleanup, ConcurrentRunsFromEightThreadsAreAllCorrect) {
  constexpr int kThreads = 8, kRunsEach = 6;
  std::atomic<int> failures{0};
  const auto fds_before = open_fd_count();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < kRunsEach; ++i) {
        const std::string tag = std::to_string(t) + "-" + std::to_string(i);
        Request request;
        request.stdin_data = "in-" + tag;
        request.env = {{"TAG", tag}};
        const int code = (t * kRunsEach + i) % 50;
        auto result = run_sh("cat; echo \" $TAG\"; echo err-$TAG >&2; exit " + std::to_string(code),
                             local_policy(), request);
        const bool ok = result.exit_code == code &&
                        result.stdout_data == "in-" + tag + " " + tag + "\n" &&
                        result.stderr_data == "err-" + tag + "\n" &&
                        result.status == (code == 0 ? Status::ok : Status::exit_nonzero);
        if (!ok) {
          ++failures;
          ADD_FAILURE() << tag << ": " << describe(result);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_TRUE(children_of_this_process().empty());
}

TEST(LocalCleanup, TimeoutsInParallelThreadsStayIndependent) {
  // One thread's stop must not touch another thread's payload.
  Policy quick = local_policy();
  quick.limits.wall_time = 300ms;
  Result slow_result, quick_result;
  std::thread slow([&] { slow_result = run_sh("sleep 1; echo finished"); });
  std::thread fast([&] { quick_result = run_sh("sleep 10", quick); });
  slow.join();
  fast.join();
  EXPECT_EQ(quick_result.status, Status::timeout);
  EXPECT_EQ(slow_result.status, Status::ok) << describe(slow_result);
  EXPECT_EQ(slow_result.stdout_data, "finished\n");
}

TEST(LocalCleanup, TheTreeDiesWhenTheHostDies) {
  TempDir dir;
  // A host process that runs a long payload and is then SIGKILLed mid-run: rlm-sandbox-init gets
  // its parent-death SIGTERM and takes the payload (here a setsid daemon too) down with it.
  const pid_t host = fork();
  ASSERT_GE(host, 0);
  if (host == 0) {
    run_sh("setsid sh -c 'echo $$ > " + dir.file("daemon.pid") + "; exec sleep 60' & echo $$ > " +
           dir.file("main.pid") + "; sleep 60");
    _exit(0);
  }
  const auto give_up = Clock::now() + 5s;
  while ((dir.read("daemon.pid").empty() || dir.read("main.pid").empty()) && Clock::now() < give_up)
    std::this_thread::sleep_for(10ms);
  const pid_t daemon = std::stoi(dir.read("daemon.pid"));
  const pid_t main_pid = std::stoi(dir.read("main.pid"));
  kill(host, SIGKILL);
  waitpid(host, nullptr, 0);
  const auto deadline = Clock::now() + 2s;
  while ((process_alive(daemon) || process_alive(main_pid)) && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(process_alive(main_pid));
  EXPECT_FALSE(process_alive(daemon));
}

}  // namespace
}  // namespace rlm::test
