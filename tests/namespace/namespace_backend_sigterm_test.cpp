// Who stopped the sandbox (issue 11, line 14): a SIGTERM the payload sends to PID 1 is reported as
// the payload's, not as one "from outside"; one from the runtime still is.
#include <gtest/gtest.h>
#include <signal.h>

#include "namespace_backend_test_util.hpp"

namespace rlm::test {
namespace {

TEST(NamespaceSigterm, APayloadThatSignalsPid1IsNamedAsTheSender) {
  const auto result = run_sh("kill -TERM 1; sleep 5");
  EXPECT_EQ(result.status, Status::signaled) << describe(result);
  EXPECT_EQ(result.signal, SIGTERM);
  EXPECT_NE(result.detail.find("the payload sent SIGTERM to rlm-sandbox-init"), std::string::npos)
      << result.detail;
  EXPECT_EQ(result.detail.find("from outside"), std::string::npos) << result.detail;
}

TEST(NamespaceSigterm, AQueuedSigtermCannotPassForOneFromOutside) {
  // rt_sigqueueinfo lets the sender write si_pid itself (here 0, what an outside sender shows as).
  const auto result = run_ns({"python3", "-c",
                              R"py(import ctypes, time
info = (ctypes.c_int * 32)(15, 0, -1)  # SIGTERM, errno 0, SI_QUEUE; si_pid 0
assert ctypes.CDLL(None).syscall(129, 1, 15, ctypes.byref(info)) == 0
time.sleep(5))py"});
  EXPECT_EQ(result.status, Status::signaled) << describe(result);
  EXPECT_NE(result.detail.find("the payload sent SIGTERM"), std::string::npos) << result.detail;
}

TEST(NamespaceSigterm, TheRuntimesOwnStopIsStillFromOutside) {
  Request request;
  request.timeout = 500ms;
  const auto result = run_sh("trap '' TERM; sleep 5", ns_policy(), request);
  EXPECT_EQ(result.status, Status::timeout) << describe(result);
  EXPECT_EQ(result.detail.find("the payload sent"), std::string::npos) << result.detail;
}

}  // namespace
}  // namespace rlm::test
