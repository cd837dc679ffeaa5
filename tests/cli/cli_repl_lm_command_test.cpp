// The `command:` LM handler's processes die with the repl that started them (issue 11, line 8):
// whether the repl ends normally or is SIGKILLed mid-call, no process of the command is left,
// children and grandchildren included, even one that left the command's process group.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_util.hpp"
#include "repl_driver.hpp"
#include "support/host_probes.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string random_token() {
  unsigned char bytes[8];
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(bytes), 8);
  std::string token = "rlm-lm-token-";
  for (unsigned char byte : bytes) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", byte);
    token += hex;
  }
  return token;
}

// Pids of other processes whose command line holds `token` (and, when given, `also`).
std::vector<pid_t> processes_with(const std::string& token, const std::string& also = "") {
  std::vector<pid_t> found;
  const auto with_also = also.empty() ? std::vector<pid_t>{} : processes_with_cmdline(also);
  for (const pid_t pid : processes_with_cmdline(token))
    if (pid != getpid() &&
        (also.empty() || std::find(with_also.begin(), with_also.end(), pid) != with_also.end()))
      found.push_back(pid);
  return found;
}

// Waits up to `limit` for the count of processes with `token` (and `also`) to satisfy `done`.
template <typename Done>
std::size_t wait_for_count(const std::string& token, const std::string& also,
                           std::chrono::milliseconds limit, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto count = processes_with(token, also).size();
  while (!done(count) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    count = processes_with(token, also).size();
  }
  return count;
}

// Whatever the test leaves is killed, even when an assertion failed.
struct KillLeftovers {
  std::string token;
  ~KillLeftovers() {
    for (pid_t pid : processes_with(token)) kill(pid, SIGKILL);
  }
};

// A slow LM command with processes at three levels below the repl, each carrying `token` in its
// command line: the shell, a child python, a grandchild python, and one that left the shell's
// process group and session with setsid.
std::string slow_command(const std::string& token) {
  const std::string sleeper = "python3 -c 'import time; time.sleep(300)' " + token;
  return "command:(" + sleeper + "; :) & setsid " + sleeper + " & " + sleeper + "; : " + token;
}

TEST(CliReplLmCommand, KillingTheReplKillsItsLmCommandProcesses) {
  const std::string token = random_token();
  KillLeftovers leftovers{token};
  Repl repl({"--lm", slow_command(token)});
  repl.send({{"id", 1}, {"op", "execute"}, {"code", "llm_query('hello')"}});
  ASSERT_EQ(repl.next().value("event", ""), "ready");
  // Three pythons: the shell's child, the subshell's child and the one in its own session.
  const auto started =
      wait_for_count(token, "python3", 30s, [](std::size_t count) { return count >= 3; });
  ASSERT_GE(started, 3u) << "the LM command did not start";

  repl.kill_now();
  const auto left = wait_for_count(token, "", 10s, [](std::size_t count) { return count == 0; });
  EXPECT_EQ(left, 0u) << "processes of the LM command outlived the SIGKILLed repl";
}

// A call the limiter gave up on (--llm-timeout) keeps its command running until the handler's own
// ten-minute cap; a repl that then ends normally takes the command with it.
TEST(CliReplLmCommand, AReplThatEndsNormallyLeavesNoLmCommandProcesses) {
  const std::string token = random_token();
  KillLeftovers leftovers{token};
  Repl repl({"--lm", slow_command(token), "--llm-timeout", "1s"});
  repl.send({{"id", 1}, {"op", "execute"}, {"code", "print(llm_query('hello'))"}});
  ASSERT_EQ(repl.next().value("event", ""), "ready");
  const auto result = repl.next();
  EXPECT_NE(result["result"].value("stdout", "").find("timed out"), std::string::npos)
      << result.dump();
  const auto running =
      wait_for_count(token, "python3", 30s, [](std::size_t count) { return count >= 3; });
  EXPECT_GE(running, 3u) << "the LM command is still running";
  repl.end_input();
  EXPECT_EQ(repl.wait_exit(), 0);
  const auto left = wait_for_count(token, "", 10s, [](std::size_t count) { return count == 0; });
  EXPECT_EQ(left, 0u) << "processes of the LM command outlived the repl";
}

}  // namespace
}  // namespace rlm::test
