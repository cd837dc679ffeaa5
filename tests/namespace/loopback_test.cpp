// LoopbackPlan against the real kernel: "lo" inside the sandbox's network namespace.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "child_setup_harness.hpp"

namespace rlm::ns::test {
namespace {

TEST(Loopback, IsUpAfterThePlanSoLocalTcpWorks) {
  const auto run = run_script(test_policy(),
                              "/probe loopback; ip -o link show lo; echo interfaces:; "
                              "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.out.substr(0, 3), "ok\n") << run.out;
  EXPECT_NE(run.out.find("<LOOPBACK,UP,LOWER_UP>"), std::string::npos) << run.out;
  // A new network namespace: lo and nothing else (no host interfaces).
  EXPECT_NE(run.out.find("\ninterfaces:\nlo\n"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.substr(run.out.size() - 3), "lo\n") << run.out;
}

TEST(Loopback, IsDownWithoutThePlan) {
  // Control for the test above: the fresh namespace's lo is down, so the probe fails.
  const auto run =
      run_script(test_policy(), "/probe loopback; ip -o link show lo", {.loopback = false});
  EXPECT_NE(run.out.substr(0, 3), "ok\n") << run.out;
  EXPECT_EQ(run.out.find(",UP"), std::string::npos) << run.out;
}

TEST(Loopback, ApplyReportsTheKernelsRefusal) {
  const LoopbackPlan plan = LoopbackPlan::prepare();
  // An unprivileged process, without CAP_NET_ADMIN for its network namespace: the kernel acks
  // the request with EPERM, which apply() must report as the failed step.
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (syscall(SYS_setresuid, 65534, 65534, 65534) != 0) _exit(90);
    process::ChildFailure failure;
    const bool ok = plan.apply(failure);
    const int result[2] = {ok ? 1 : 0, failure.error};
    if (write(report[1], result, sizeof result) != sizeof result) _exit(91);
    const bool named = std::string_view(failure.step) == "bring up lo";
    _exit(named ? 0 : 92);
  }
  close(report[1]);
  int result[2] = {-1, -1};
  EXPECT_EQ(read(report[0], result, sizeof result), static_cast<ssize_t>(sizeof result));
  close(report[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(result[0], 0) << "apply() succeeded without CAP_NET_ADMIN";
  EXPECT_EQ(result[1], EPERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace rlm::ns::test
