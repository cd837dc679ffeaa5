// The server says what it does (issue 26, line 12): one JSON line on its stderr per request,
// refusal and end; `rlm-sandbox server status` lists its runs and sessions with owner and age, and
// `server kill ID` ends one -- a client only its own uid's, root any.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/session.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

struct CliOutcome {
  int exit_code = -1;
  std::string out;
};

// `rlm-sandbox ARGS...` (as uid 65534 when `as_nobody`): its exit code and stdout.
CliOutcome cli_output(std::vector<std::string> args, bool as_nobody = false) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return {};
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  const pid_t pid = spawn(std::move(args), pipe_fds[1], -1, as_nobody);
  close(pipe_fds[1]);
  CliOutcome outcome;
  outcome.out = read_to_eof(pipe_fds[0]);
  close(pipe_fds[0]);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status))
    outcome.exit_code = WEXITSTATUS(status);
  return outcome;
}

// Polls `status` (as root, which sees all) until `count` activities run, for up to 60 s.
json running_when(const std::string& socket, std::size_t count) {
  json running = json::array();
  for (int i = 0; i < 600; ++i) {
    running = ServerConnection(socket).status()["running"];
    if (running.size() >= count) return running;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return running;
}

TEST(ServerLog, EveryRequestRefusalAndEndIsOneJsonLine) {
  TempDir dir;
  std::optional<ServerUnderTest> server(std::in_place, dir,
                                        std::vector<std::string>{"--pool", "default=1"});
  ASSERT_TRUE(server->ready()) << server->log();
  const auto ran =
      cli_output({"run", "-q", "--server", server->socket(), "--", "sh", "-c", "exit 3"});
  EXPECT_EQ(ran.exit_code, 3);
  const auto refused = cli_output({"run", "-q", "--server", server->socket(), "--policy",
                                   "not-offered\nforged line", "--", "true"});
  EXPECT_EQ(refused.exit_code, 125);
  EXPECT_EQ(server->stop(), 0);
  const std::string text = server->log();
  const auto lines = log_lines(text);
  ASSERT_GE(lines.size(), 5u) << text;
  EXPECT_EQ(lines.front()["event"], "listening") << text;
  EXPECT_EQ(lines.back()["event"], "stopped") << text;
  const auto request =
      find_line(lines, {{"event", "request"}, {"op", "run"}, {"policy", "default"}});
  ASSERT_TRUE(request) << text;
  EXPECT_EQ((*request)["uid"], getuid());
  EXPECT_TRUE((*request)["pid"].is_number_integer());
  const auto end = find_line(lines, {{"event", "end"}, {"op", "run"}, {"id", (*request)["id"]}});
  ASSERT_TRUE(end) << text;
  EXPECT_EQ((*end)["status"], "exit_nonzero");
  EXPECT_EQ((*end)["exit_code"], 3);
  EXPECT_TRUE((*end)["wall_ms"].is_number()) << text;
  // The client's text stays inside its JSON string: the newline it sent forges no line.
  const auto refusal = find_line(lines, {{"event", "refusal"}, {"kind", "refused"}, {"op", "run"}});
  ASSERT_TRUE(refusal) << text;
  EXPECT_NE((*refusal)["message"].get<std::string>().find("is not offered by this server"),
            std::string::npos);
  EXPECT_EQ(text.find("\nforged line"), std::string::npos) << text;
}

TEST(ServerStatus, AClientSeesAndKillsOnlyItsOwnAndRootAny) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);  // uid 65534 must reach the socket
  ServerUnderTest server(dir, {"--pool", "default=1", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  const std::string socket = server.socket();
  int root_out = -1, nobody_out = -1;
  const pid_t roots = spawn_cli({"run", "-q", "--server", socket, "--", "sleep", "60"}, root_out);
  ASSERT_EQ(running_when(socket, 1).size(), 1u) << server.log();
  std::vector<std::string> nobody_run = {
      bin_path("rlm-sandbox"), "run", "-q", "--server", socket, "--", "sleep", "60"};
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t nobodys = spawn(nobody_run, pipe_fds[1], -1, /*as_nobody=*/true);
  close(pipe_fds[1]);
  nobody_out = pipe_fds[0];
  const json running = running_when(socket, 2);
  ASSERT_EQ(running.size(), 2u) << server.log();
  std::uint64_t root_id = 0, nobody_id = 0;
  for (const auto& item : running) {
    EXPECT_EQ(item["op"], "run");
    EXPECT_EQ(item["policy"], "default");
    EXPECT_TRUE(item["age_ms"].is_number_integer());
    EXPECT_TRUE(item["started"].is_string());
    (item["uid"] == 0 ? root_id : nobody_id) = item["id"].get<std::uint64_t>();
  }
  ASSERT_NE(root_id, 0u);
  ASSERT_NE(nobody_id, 0u);

  // uid 65534 sees only its own run, and cannot kill root's (told apart from none by nothing).
  const auto seen = cli_output({"server", "status", "--server", socket, "--json"}, true);
  ASSERT_EQ(seen.exit_code, 0);
  const json status = json::parse(seen.out);
  EXPECT_EQ(status["scope"], "own");
  ASSERT_EQ(status["running"].size(), 1u) << seen.out;
  EXPECT_EQ(status["running"][0]["id"], nobody_id);
  EXPECT_EQ(status["running"][0]["uid"], 65534);
  EXPECT_TRUE(status["pools"].contains("default"));
  EXPECT_EQ(
      cli_output({"server", "kill", std::to_string(root_id), "--server", socket}, true).exit_code,
      125);
  EXPECT_EQ(cli_output({"server", "kill", "999999", "--server", socket}, true).exit_code, 125);
  EXPECT_EQ(running_when(socket, 2).size(), 2u) << "a refused kill ended something";

  // Its own it may kill; root kills any. Each run ends interrupted, saying who.
  EXPECT_EQ(
      cli_output({"server", "kill", std::to_string(nobody_id), "--server", socket}, true).exit_code,
      0);
  EXPECT_EQ(cli_output({"server", "kill", std::to_string(root_id), "--server", socket}).exit_code,
            0);
  for (const pid_t pid : {roots, nobodys}) {
    int wait_status = 0;
    ASSERT_EQ(waitpid(pid, &wait_status, 0), pid);
    ASSERT_TRUE(WIFEXITED(wait_status));
    EXPECT_GT(WEXITSTATUS(wait_status), 128) << "a killed run exits 128+N";
  }
  close(root_out);
  close(nobody_out);
  EXPECT_EQ(ServerConnection(socket).status()["running"].size(), 0u);
  const auto lines = log_lines(server.log());
  for (const auto& [id, by] : {std::pair{nobody_id, 65534}, std::pair{root_id, 0}}) {
    const auto end = find_line(lines, {{"event", "end"}, {"id", id}});
    ASSERT_TRUE(end) << server.log();
    EXPECT_EQ((*end)["status"], "interrupted");
    EXPECT_EQ((*end)["detail"], "killed by uid " + std::to_string(by) +
                                    " with `rlm-sandbox server kill " + std::to_string(id) + "`");
  }
  EXPECT_TRUE(find_line(lines, {{"event", "refusal"}, {"op", "kill"}, {"uid", 65534}}));
}

TEST(ServerStatus, AKilledSessionsCellEndsAtOnceSayingWho) {
  TempDir dir;
  ServerUnderTest server(dir, {"--session-pool", "python-repl=1"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto session = ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
  const json running = running_when(server.socket(), 1);
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0]["op"], "session");
  const auto id = running[0]["id"].get<std::uint64_t>();
  // A cell that would run for the policy's whole wall time.
  auto cell = std::async(std::launch::async, [&] { return session->execute("while True: pass"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ServerConnection(server.socket()).kill(id);
  ASSERT_EQ(cell.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the cell did not end when its session was killed";
  const CellResult ended = cell.get();
  EXPECT_NE(ended.status, CellStatus::ok);
  EXPECT_NE(ended.error.find("killed by uid " + std::to_string(getuid())), std::string::npos)
      << ended.error;
  session->close();
  eventually([&] { return ServerConnection(server.socket()).status()["running"].empty(); });
  const auto lines = log_lines(server.log());
  const auto end = find_line(lines, {{"event", "end"}, {"op", "session"}, {"id", id}});
  ASSERT_TRUE(end) << server.log();
  EXPECT_NE((*end)["reason"].get<std::string>().find("killed by uid"), std::string::npos);
}

}  // namespace
}  // namespace rlm::test
