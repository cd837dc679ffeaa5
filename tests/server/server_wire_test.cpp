// Hostile or broken clients: an oversize frame, garbage, nesting too deep, a silent client, a
// flood of connections, fds that are not streams. Each is refused or dropped, and the server goes
// on serving everyone else.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include "../cli/cli_test_util.hpp"
#include "raw_client.hpp"
#include "server/wire.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;
using server::Clock;

class ServerWireTest : public SharedServerTest<ServerWireTest> {
 public:
  static std::vector<std::string> server_args() {
    return {"--pool", "default=0", "--max-clients", "4"};
  }
  // The server still serves a normal run.
  static void still_serves() {
    auto outcome = cli({"run", "--server", server_->socket(), "--", "/bin/echo", "ok"});
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err << server_->log();
    EXPECT_EQ(outcome.out, "ok\n");
  }
};

TEST_F(ServerWireTest, OversizeFrameIsRefusedBeforeItIsRead) {
  host::UniqueFd fd(connect_raw(server_->socket()));
  send_bytes(fd.get(), header(0x7FFFFFFF) + "{");
  const json reply = answer(fd.get());
  EXPECT_EQ(reply.value("op", ""), "error") << reply.dump();
  EXPECT_NE(reply.value("message", "").find("over the limit"), std::string::npos) << reply.dump();
  still_serves();
}

TEST_F(ServerWireTest, GarbageAndDeepNestingAreRefused) {
  for (const std::string& body :
       {std::string("not json at all"), std::string(100, '[') + std::string(100, ']'),
        std::string("[1,2,3]"), std::string("{\"no_op\":1}")}) {
    host::UniqueFd fd(connect_raw(server_->socket()));
    send_bytes(fd.get(), header(static_cast<std::uint32_t>(body.size())) + body);
    const json reply = answer(fd.get());
    EXPECT_EQ(reply.value("op", ""), "error") << body.substr(0, 20) << " -> " << reply.dump();
  }
  still_serves();
}

TEST_F(ServerWireTest, SilentClientIsDroppedAndOthersAreServedMeanwhile) {
  host::UniqueFd silent(connect_raw(server_->socket()));
  host::UniqueFd partial(connect_raw(server_->socket()));
  send_bytes(partial.get(), header(100) + "{\"op\":");  // begins a frame and never ends it
  still_serves();
  // Both are closed by the server on its own (after its 5 s and 10 s deadlines).
  EXPECT_EQ(answer(silent.get()).value("op", ""), "error");
  EXPECT_EQ(answer(partial.get()).value("op", ""), "error");
  char byte;
  EXPECT_EQ(recv(silent.get(), &byte, 1, 0), 0) << "the silent connection is closed";
}

TEST_F(ServerWireTest, ConnectionsBeyondMaxClientsAreRefused) {
  std::vector<host::UniqueFd> held;
  const std::string hello = R"({"op":"hello"})";
  const std::string frame = header(static_cast<std::uint32_t>(hello.size())) + hello;
  for (int i = 0; i < 4; ++i) {
    // Answered: accepted, and counted, before the next one connects (no sleep to guess it). A
    // refusal here is the fixture's readiness probe, closed but not yet noticed by its thread
    // (seen once under a sanitizer): it counts until then, so this one is tried again.
    json reply;
    for (int attempt = 0; attempt < 100; ++attempt) {
      host::UniqueFd fd(connect_raw(server_->socket()));
      if (send(fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(frame.size()))
        reply = answer(fd.get());
      if (reply.value("op", "") == "hello") {
        held.push_back(std::move(fd));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(reply.value("op", ""), "hello") << i << ": " << reply.dump();
  }
  host::UniqueFd extra(connect_raw(server_->socket()));
  const json reply = answer(extra.get());
  EXPECT_EQ(reply.value("kind", ""), "unavailable") << reply.dump();
  EXPECT_NE(reply.value("message", "").find("maximum of 4"), std::string::npos);
  held.clear();
  // Once they are gone (their threads notice the hangup), a client is served again.
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    auto outcome = cli({"run", "--server", server_->socket(), "--", "/bin/true"});
    served = outcome.exit_code == 0;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served);
}

TEST_F(ServerWireTest, RunWithADirectoryAsStdioIsRefused) {
  host::UniqueFd fd(connect_raw(server_->socket()));
  host::UniqueFd directory(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  host::UniqueFd path(open("/", O_PATH | O_CLOEXEC));
  host::UniqueFd null(open("/dev/null", O_RDWR | O_CLOEXEC));
  const int fds[3] = {directory.get(), null.get(), path.get()};
  server::send_frame(fd.get(),
                     {{"op", "run"}, {"policy", "default"}, {"request", {{"argv", {"/bin/true"}}}}},
                     Clock::now() + std::chrono::seconds(5), fds);
  const json reply = answer(fd.get());
  EXPECT_EQ(reply.value("kind", ""), "invalid") << reply.dump();
  EXPECT_NE(reply.value("message", "").find("stdin"), std::string::npos) << reply.dump();
}

TEST_F(ServerWireTest, RunWithoutItsFdsIsRefused) {
  host::UniqueFd fd(connect_raw(server_->socket()));
  server::send_frame(fd.get(),
                     {{"op", "run"}, {"policy", "default"}, {"request", {{"argv", {"/bin/true"}}}}},
                     Clock::now() + std::chrono::seconds(5));
  const json reply = answer(fd.get());
  EXPECT_EQ(reply.value("kind", ""), "invalid") << reply.dump();
  EXPECT_NE(reply.value("message", "").find("exactly 3 fds"), std::string::npos) << reply.dump();
}

TEST_F(ServerWireTest, HelloListsThePolicies) {
  const json hello = ServerConnection(server_->socket()).hello();
  EXPECT_EQ(hello["version"], 1);
  EXPECT_EQ(hello["policies"], json::array({"default"}));
}

}  // namespace
}  // namespace rlm::test
