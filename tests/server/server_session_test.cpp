// REPL sessions through the server: cells relayed, llm_query answered by the client's own
// handler, snapshots, and the CLI's `repl --server`.
#include <gtest/gtest.h>

#include "../cli/repl_driver.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/llm.hpp"
#include "server/client_wire.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

class ServerSessionTest : public SharedServerTest<ServerSessionTest> {
 public:
  static std::vector<std::string> server_args() { return {"--session-pool", "python-repl=1"}; }
};

// Answers every call with the prompt reversed, and counts them.
class ReversingHandler final : public LlmHandler {
 public:
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    ++calls;
    done(LlmAnswer::of_text(std::string(call.prompt.rbegin(), call.prompt.rend())));
  }
  std::atomic<int> calls{0};
};

TEST_F(ServerSessionTest, CellsStatePersistsAndLlmQueryIsAnsweredByTheClient) {
  auto handler = std::make_shared<ReversingHandler>();
  SessionOptions options;
  options.context = "the context";
  options.llm = handler;
  auto session = ServerConnection(server_->socket()).open_session("python-repl", nullptr, options);
  EXPECT_EQ(session->backend(), "server");
  auto first = session->execute("x = 41\nprint(context)");
  EXPECT_EQ(first.status, CellStatus::ok) << first.error;
  EXPECT_EQ(first.stdout_data, "the context\n");
  auto second = session->execute("print(x + 1, llm_query('abc'))");
  EXPECT_EQ(second.status, CellStatus::ok) << second.error;
  EXPECT_EQ(second.stdout_data, "42 cba\n");
  EXPECT_EQ(second.llm_calls, 1u);
  EXPECT_EQ(handler->calls.load(), 1);

  const SnapshotId snapshot = session->snapshot();
  EXPECT_EQ(session->execute("x = 0").status, CellStatus::ok);
  session->restore(snapshot);
  EXPECT_EQ(session->execute("print(x)").stdout_data, "41\n");

  auto failing = session->execute("raise ValueError('no')");
  EXPECT_EQ(failing.status, CellStatus::error);
  EXPECT_NE(failing.error.find("ValueError"), std::string::npos);
  const Result closed = session->close();
  EXPECT_NE(closed.status, Status::sandbox_error) << closed.detail;
  EXPECT_THROW(session->execute("1"), Error);
}

// A failed call returns the RLM library's "Error: ..." text in the cell (it does not raise).
TEST_F(ServerSessionTest, WithoutAHandlerLlmQueryFailsInTheCell) {
  auto session = ServerConnection(server_->socket()).open_session("python-repl", nullptr, {});
  auto cell = session->execute("print(llm_query('x'))");
  EXPECT_EQ(cell.status, CellStatus::ok);
  EXPECT_EQ(cell.stdout_data, "Error: no LM handler is configured for this session\n");
  session->close();
}

// A client that vanishes mid-session: the server closes the session, and what the cell started
// dies with its sandbox.
TEST_F(ServerSessionTest, DisconnectingClosesTheSession) {
  const std::vector<std::string> marker = {"sleep", "73.125"};
  {
    const auto socket = server::connect_to_server(server_->socket());
    const auto deadline = [] { return server::Clock::now() + std::chrono::seconds(60); };
    server::send_frame(socket.get(), {{"op", "session_open"}, {"policy", "python-repl"}},
                       deadline());
    ASSERT_EQ(server::server_reply(socket.get(), deadline())["op"], "session_opened");
    server::send_frame(
        socket.get(),
        {{"op", "execute"}, {"code", "import subprocess\nsubprocess.Popen(['sleep', '73.125'])"}},
        deadline());
    const auto cell = server::server_reply(socket.get(), deadline());
    ASSERT_EQ(cell["op"], "cell_result") << cell.dump();
    ASSERT_EQ(cell["result"]["status"], "ok") << cell.dump();
    // Popen returns once the exec has let go of the parent, which is before the kernel has
    // set the new command line /proc shows (it once was not there yet under a loaded CI).
    ASSERT_TRUE(eventually([&] { return !processes_running(marker).empty(); }))
        << "the cell's process is not running";
  }  // the connection closes here, without a close frame
  EXPECT_TRUE(eventually([&] { return processes_running(marker).empty(); }))
      << "the session outlived its client";
}

TEST_F(ServerSessionTest, PolicyNotOfferedForSessionsIsRefused) {
  EXPECT_THROW(ServerConnection(server_->socket()).open_session("default", nullptr, {}),
               ServerRefused);
}

TEST_F(ServerSessionTest, ReplCommandThroughTheServerWithTheOrchestratorAnswering) {
  Repl repl({"--server", server_->socket(), "--policy", "python-repl"});
  repl.send({{"op", "context"}, {"context", "ctx"}});
  auto ready = repl.next();
  ASSERT_EQ(ready.value("event", ""), "ready") << ready.dump();
  EXPECT_EQ(ready["backend"], "server");
  repl.send({{"id", 1}, {"op", "execute"}, {"code", "print(context, llm_query('q'))"}});
  auto query = repl.next();
  ASSERT_EQ(query.value("event", ""), "llm_query") << query.dump();
  EXPECT_EQ(query["prompt"], "q");
  repl.send({{"op", "llm_result"}, {"query_id", query["query_id"]}, {"text", "answer"}});
  auto result = repl.next();
  ASSERT_TRUE(result.contains("result")) << result.dump();
  EXPECT_EQ(result["result"]["stdout"], "ctx answer\n");
  repl.send({{"id", 2}, {"op", "close"}});
  EXPECT_TRUE(repl.next().contains("result"));
}

TEST_F(ServerSessionTest, ReplCommandFailsWith125WhenTheServerCannotServe) {
  ProcessOptions options;
  options.stdin_data = "{\"op\":\"context\",\"context\":\"\"}\n";
  auto outcome = cli({"repl", "--server", server_->socket(), "--policy", "strict"}, options);
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find("not offered"), std::string::npos) << outcome.err;
}

}  // namespace
}  // namespace rlm::test
