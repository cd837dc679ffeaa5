// The server as a fleet's node (issue 28, docs/fleet.md): health, ready and capacity; the cap on
// runs and sessions held at once, refused at once past it; drain (the op and SIGTERM), with its
// grace; and the node's id on results and session ids.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <future>
#include <thread>

#include "../cli/cli_test_util.hpp"
#include "raw_client.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/client_wire.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

constexpr auto kPatience = std::chrono::seconds(60);  // a loaded machine fills pools slowly

// Asks until `wanted(reply)` or the patience runs out; returns the last reply.
json capacity_when(const std::string& socket, const std::function<bool(const json&)>& wanted) {
  json reply;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  do {
    reply = ServerConnection(socket).capacity();
    if (wanted(reply)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return reply;
}

Result run_on(const std::string& socket, std::vector<std::string> argv) {
  Request request;
  request.argv = std::move(argv);
  return ServerConnection(socket).run(request, "default");
}

TEST(ServerNode, HealthReadyAndCapacityDescribeTheNode) {
  TempDir dir;
  ServerUnderTest server(dir, {"--node-id", "node-a1", "--max-sandboxes", "3", "--pool",
                               "default=1", "--session-pool", "python-repl=1"});
  ASSERT_TRUE(server.ready()) << server.log();
  const json health = ServerConnection(server.socket()).health();
  EXPECT_EQ(health["alive"], true);
  EXPECT_EQ(health["node"], "node-a1");
  EXPECT_EQ(health["pid"], server.pid());

  const json full =
      capacity_when(server.socket(), [](const json& c) { return c["ready"] == true; });
  ASSERT_EQ(full["ready"], true) << full.dump();
  const json ready = ServerConnection(server.socket()).ready();
  EXPECT_EQ(ready["ready"], true) << ready.dump();
  EXPECT_TRUE(ready["why"].empty()) << ready.dump();
  EXPECT_EQ(full["node_id"], "node-a1");
  EXPECT_FALSE(full["version"].get<std::string>().empty());
  EXPECT_EQ(full["max_sandboxes"], 3);
  EXPECT_EQ(full["running"], 0);
  EXPECT_EQ(full["starting"], 0);
  EXPECT_EQ(full["draining"], false);
  EXPECT_GE(full["cores"].get<int>(), 1);
  EXPECT_GT(full["memory_bytes"].get<std::uint64_t>(), 0u);
  const auto& backends = full["features"]["backends"];
  EXPECT_NE(std::find(backends.begin(), backends.end(), "namespace"), backends.end())
      << full.dump();
  EXPECT_TRUE(full["features"]["cgroup"] == "v1" || full["features"]["cgroup"] == "v2")
      << full.dump();
  EXPECT_GE(full["features"]["landlock_abi"].get<int>(), 0);
  EXPECT_EQ(full["warm_idle"]["default"]["sandboxes"], 1) << full.dump();
  EXPECT_EQ(full["warm_idle"]["default"]["min_sandboxes"], 1);
  EXPECT_EQ(full["warm_idle"]["python-repl"]["sessions"], 1) << full.dump();
  for (const char* resource : {"cpu", "memory", "io"})
    EXPECT_TRUE(full["pressure"][resource].is_number() || full["pressure"][resource].is_null());

  // A session held counts as running; its warm one is gone from the pool until refilled.
  auto session = ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
  const json holding =
      capacity_when(server.socket(), [](const json& c) { return c["running"] == 1; });
  EXPECT_EQ(holding["running"], 1) << holding.dump();
  session->close();
  const json after =
      capacity_when(server.socket(), [](const json& c) { return c["running"] == 0; });
  EXPECT_EQ(after["running"], 0) << after.dump();

  // The CLI says the same.
  auto printed = cli({"server", "capacity", "--server", server.socket(), "--json"});
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_EQ(json::parse(printed.out)["node_id"], "node-a1");
  auto table = cli({"server", "capacity", "--server", server.socket()});
  EXPECT_NE(table.out.find("node node-a1"), std::string::npos) << table.out;
  EXPECT_EQ(cli({"server", "health", "--server", server.socket()}).exit_code, 0);
}

TEST(ServerNode, ResultsAndSessionIdsNameTheNode) {
  TempDir dir;
  ServerUnderTest server(
      dir, {"--node-id", "n7", "--pool", "default=1", "--session-pool", "python-repl=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  const Result result = run_on(server.socket(), {"/bin/true"});
  EXPECT_EQ(result.status, Status::ok) << result.detail;
  EXPECT_EQ(result.node, "n7");
  EXPECT_EQ(result_from_json(result.to_json()).node, "n7");
  auto printed = cli({"run", "--server", server.socket(), "--json", "--", "/bin/true"});
  EXPECT_EQ(json::parse(printed.out).value("node", ""), "n7") << printed.out << printed.err;

  // The session_opened frame carries the node and a session id that names it.
  const auto socket = server::connect_to_server(server.socket());
  const auto deadline = [] { return server::Clock::now() + kPatience; };
  server::send_frame(socket.get(), {{"op", "session_open"}, {"policy", "python-repl"}}, deadline());
  const json opened = server::server_reply(socket.get(), deadline());
  ASSERT_EQ(opened["op"], "session_opened") << opened.dump();
  EXPECT_EQ(opened["node"], "n7");
  EXPECT_EQ(opened["session_id"].get<std::string>().rfind("n7/", 0), 0u) << opened.dump();
}

// Past --max-sandboxes a run or session is refused at once (never queued), and the slot comes
// back when one ends.
TEST(ServerNode, PastMaxSandboxesARequestIsRefusedAtOnce) {
  TempDir dir;
  ServerUnderTest server(
      dir, {"--max-sandboxes", "2", "--pool", "default=0", "--session-pool", "python-repl=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto first = ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
  auto second = ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_EQ(refusal_kind([&] {
              ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
            }),
            "resource_exhausted");
  EXPECT_EQ(refusal_kind([&] { run_on(server.socket(), {"/bin/true"}); }), "resource_exhausted");
  // At once: far below any session's or run's own deadline (tens of seconds).
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(10));
  const json full = ServerConnection(server.socket()).capacity();
  EXPECT_EQ(full["running"].get<int>() + full["starting"].get<int>(), 2) << full.dump();
  EXPECT_EQ(first->execute("print(1)").stdout_data, "1\n");  // the held ones are unharmed

  second->close();
  second.reset();
  capacity_when(server.socket(), [](const json& c) { return c["running"] == 1; });
  EXPECT_EQ(run_on(server.socket(), {"/bin/true"}).status, Status::ok);
  first->close();
  const auto lines = log_lines(server.log());
  EXPECT_TRUE(find_line(lines, {{"event", "refusal"}, {"kind", "resource_exhausted"}}))
      << server.log();
}

// Drain: ready turns false and new work is refused, what runs goes on and finishes, and the server
// then exits 0 by itself.
TEST(ServerNode, DrainRefusesNewWorkLetsRunningWorkFinishThenExits) {
  TempDir dir;
  ServerUnderTest server(dir, {"--node-id", "d1", "--drain-grace", "120s", "--pool", "default=1",
                               "--session-pool", "python-repl=1"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto session = ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
  ASSERT_EQ(session->execute("x = 5").status, CellStatus::ok);

  const json draining = ServerConnection(server.socket()).drain();
  EXPECT_EQ(draining["node"], "d1");
  EXPECT_EQ(draining["grace_ms"], 120000);
  const json ready = ServerConnection(server.socket()).ready();
  EXPECT_EQ(ready["ready"], false);
  EXPECT_NE(ready["why"].dump().find("draining"), std::string::npos) << ready.dump();
  EXPECT_EQ(cli({"server", "ready", "--server", server.socket()}).exit_code, 1);
  EXPECT_EQ(ServerConnection(server.socket()).capacity()["draining"], true);
  EXPECT_EQ(refusal_kind([&] { run_on(server.socket(), {"/bin/true"}); }), "draining");
  EXPECT_EQ(refusal_kind([&] {
              ServerConnection(server.socket()).open_session("python-repl", nullptr, {});
            }),
            "draining");

  // The session in progress goes on; the server is still there while it is held.
  EXPECT_EQ(session->execute("print(x * 2)").stdout_data, "10\n");
  EXPECT_EQ(server.exited_within(std::chrono::milliseconds(200)), -2)
      << "exited with a session open";
  const Result closed = session->close();
  EXPECT_EQ(closed.node, "d1");
  EXPECT_NE(closed.status, Status::node_drained) << closed.detail;
  EXPECT_EQ(server.exited_within(kPatience), 0) << server.log();
  struct stat status {};
  EXPECT_NE(stat(server.socket().c_str(), &status), 0) << "the socket file is left";
}

// SIGTERM drains like the op; a run still going when the grace runs out ends node_drained, and
// its client is told so.
TEST(ServerNode, SigtermDrainsAndWhatOutlivesTheGraceEndsNodeDrained) {
  TempDir dir;
  ServerUnderTest server(dir, {"--node-id", "d2", "--drain-grace", "1s", "--pool", "default=1"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto run = std::async(std::launch::async, [&] {
    return run_on(server.socket(), {"/bin/sleep", "600"});
  });
  const json busy = capacity_when(server.socket(), [](const json& c) { return c["running"] == 1; });
  ASSERT_EQ(busy["running"], 1) << busy.dump();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_EQ(run.wait_for(kPatience), std::future_status::ready) << "the run outlived the drain";
  const Result ended = run.get();
  EXPECT_EQ(ended.status, Status::node_drained) << ended.detail;
  EXPECT_NE(ended.detail.find("node_drained"), std::string::npos) << ended.detail;
  EXPECT_EQ(ended.node, "d2");
  EXPECT_EQ(server.exited_within(kPatience), 0) << server.log();
  const auto lines = log_lines(server.log());
  EXPECT_TRUE(find_line(lines, {{"event", "draining"}, {"node", "d2"}})) << server.log();
  EXPECT_TRUE(find_line(lines, {{"event", "drained"}, {"ended", 1}})) << server.log();
}

// Only the operator drains: a tenant's drain is refused and changes nothing.
TEST(ServerNode, ATenantCannotDrainTheNode) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir,
                         {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto held = connections_as(65534, server.socket(), 2);
  ASSERT_EQ(held.size(), 2u);
  send_bytes(held[0].get(), frame_bytes(R"({"op":"drain","grace_ms":0})"));
  const json refused = answer(held[0].get());
  EXPECT_EQ(refused.value("kind", ""), "refused") << refused.dump();
  // The node contract's questions are anyone's (allowed) to ask.
  send_bytes(held[1].get(), frame_bytes(R"({"op":"ready"})"));
  EXPECT_EQ(answer(held[1].get()).value("op", ""), "ready");
  EXPECT_EQ(ServerConnection(server.socket()).capacity()["draining"], false);
  EXPECT_EQ(run_on(server.socket(), {"/bin/true"}).status, Status::ok);
}

TEST(ServerNode, BadNodeFlagsAreRefusedBeforeServing) {
  TempDir dir;
  const std::string socket = dir.file("s.sock");
  auto slash = cli({"serve", "--socket", socket, "--pool", "default=0", "--node-id", "a/b"});
  EXPECT_EQ(slash.exit_code, 2) << slash.err;
  EXPECT_NE(slash.err.find("node id"), std::string::npos) << slash.err;
  auto grace = cli({"serve", "--socket", socket, "--pool", "default=0", "--drain-grace", "soon"});
  EXPECT_EQ(grace.exit_code, 2) << grace.err;
  auto drain_grace =
      cli({"server", "health", "--grace", "1s", "--server", socket});  // --grace is drain's
  EXPECT_EQ(drain_grace.exit_code, 2) << drain_grace.err;
}

}  // namespace
}  // namespace rlm::test
