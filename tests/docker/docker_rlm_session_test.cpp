// RLM sessions on the docker backend: the Python worker in one container per session, reached
// through a socket in a bind-mounted directory (a container cannot inherit an fd), with the
// network fully off.
#include <gtest/gtest.h>

#include <filesystem>

#include "docker_test_util.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::test {
namespace {

std::string dump(const CellResult& cell) {
  return cell.to_json().dump();
}

std::size_t session_dirs() {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp"))
    if (entry.path().filename().string().starts_with("rlm-session-")) ++count;
  return count;
}

TEST(DockerRlmSession, StateLlmQueryRollbackAndCleanup) {
  REQUIRE_DOCKER();
  const auto dirs_before = session_dirs();
  const auto containers_before = containers_of_this_process().size();
  auto backend = make_backend("docker");
  ASSERT_TRUE(backend);
  Policy policy = docker_policy();
  SessionOptions options;
  options.context = "context from the host";
  options.llm = make_llm_handler("echo");
  {
    auto session = backend->open_session(policy, options);
    EXPECT_EQ(session->backend(), "docker");
    EXPECT_EQ(containers_of_this_process().size(), containers_before + 1);

    ASSERT_EQ(session->execute("x = 41").status, CellStatus::ok);
    auto next = session->execute("print(x + 1, context)");
    EXPECT_EQ(next.stdout_data, "42 context from the host\n") << dump(next);

    auto asked = session->execute("print(llm_query('ping'))");
    EXPECT_EQ(asked.stdout_data, "echo: ping\n") << dump(asked);

    auto spin = session->execute("x = 0\nwhile True: pass", std::chrono::milliseconds(1000));
    EXPECT_EQ(spin.status, CellStatus::timeout) << dump(spin);
    EXPECT_TRUE(spin.rolled_back);
    EXPECT_EQ(session->execute("x").stdout_data, "41\n");

    auto offline = session->execute(
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
        "    print('online')\n"
        "except OSError:\n"
        "    print('offline')");
    EXPECT_EQ(offline.stdout_data, "offline\n") << dump(offline);
    session->close();
  }
  EXPECT_EQ(containers_of_this_process().size(), containers_before);
  EXPECT_EQ(session_dirs(), dirs_before) << "the session's socket directory was left in /tmp";
}

// The container's cgroup tells a cell the OOM killer took from one that crashed, as on the
// namespace backend: memory_limit, rolled back, and the session goes on.
TEST(DockerRlmSession, AMemoryBalloonIsRolledBackAsMemoryLimit) {
  REQUIRE_DOCKER();
  auto backend = make_backend("docker");
  ASSERT_TRUE(backend);
  Policy policy = docker_policy();
  policy.limits.memory_bytes = 128u << 20;
  auto session = backend->open_session(policy, {});
  ASSERT_EQ(session->execute("kept = list(range(10))").status, CellStatus::ok);
  auto balloon = session->execute("b = bytearray(1 << 30)\nb[::4096] = b'x' * (len(b) // 4096)");
  EXPECT_EQ(balloon.status, CellStatus::memory_limit) << dump(balloon);
  EXPECT_TRUE(balloon.rolled_back) << dump(balloon);
  EXPECT_EQ(session->execute("print(sum(kept))").stdout_data, "45\n");
  session->close();
}

}  // namespace
}  // namespace rlm::test
