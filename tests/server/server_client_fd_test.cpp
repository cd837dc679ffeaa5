// What a client's request may make the server do with the client's own things (issue 24): an fd
// the server or the sandbox would use with the server's credentials (procfs and the like), and a
// session moved by the client's policy to a backend that isolates less.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "../cli/cli_test_util.hpp"
#include "raw_client.hpp"
#include "rlm_sandbox/client.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using host::UniqueFd;
using nlohmann::json;
using server::Clock;

void expect_served(const std::string& socket) {
  auto outcome = cli({"run", "--server", socket, "--", "/bin/echo", "ok"});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "ok\n");
}

// ---- Every fd a client hands over is a stream or data of its own, never read as the server ----

class ServerClientFdTest : public SharedServerTest<ServerClientFdTest> {
 public:
  static std::vector<std::string> server_args() {
    return {"--pool", "default=0", "--session-pool", "python-repl=1"};
  }
  // A run whose stdin is `in` (stdout, stderr: /dev/null), sent by hand: the server's answer.
  static json run_with_stdin(int in) {
    UniqueFd connection(connect_raw(server_->socket()));
    UniqueFd null(open("/dev/null", O_RDWR | O_CLOEXEC));
    const int fds[3] = {in, null.get(), null.get()};
    server::send_frame(
        connection.get(),
        {{"op", "run"}, {"policy", "default"}, {"request", {{"argv", {"/bin/true"}}}}},
        Clock::now() + std::chrono::seconds(5), fds);
    return answer(connection.get());
  }
};

TEST_F(ServerClientFdTest, AContextOnProcfsIsRefusedNotReadWithTheServersCredentials) {
  // procfs checks a read against the reader: the server, root, would see what the client cannot.
  SessionOptions options;
  options.context_file = "/proc/1/stat";
  try {
    auto session =
        ServerConnection(server_->socket()).open_session("python-repl", nullptr, options);
    const CellResult cell = session->execute("print(context)");
    FAIL() << "the session opened with a procfs file as its context: " << cell.stdout_data;
  } catch (const ServerRefused& refused) {
    EXPECT_EQ(refused.kind(), "invalid") << refused.what();
    const std::string message = refused.what();
    EXPECT_NE(message.find("context"), std::string::npos) << message;
    EXPECT_NE(message.find("proc"), std::string::npos) << message;
  }
}

TEST_F(ServerClientFdTest, AddContextFromProcfsIsRefusedAndTheSessionGoesOn) {
  SessionOptions options;
  options.context = "first";
  auto session = ServerConnection(server_->socket()).open_session("python-repl", nullptr, options);
  ContextInput input;
  input.file = "/proc/self/stat";
  try {
    const CellResult cell = session->add_context(ContextKind::context, input, std::nullopt);
    FAIL() << "add_context read a procfs file: " << cell.to_json().dump();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("proc"), std::string::npos) << error.what();
  }
  const CellResult cell = session->execute("print(context)");
  EXPECT_EQ(cell.status, CellStatus::ok) << cell.error;
  EXPECT_EQ(cell.stdout_data, "first\n");
}

TEST_F(ServerClientFdTest, StdioOnProcfsOrSysfsIsRefused) {
  for (const char* path : {"/proc/1/stat", "/proc/self/status", "/sys/kernel/uevent_seqnum"}) {
    UniqueFd file(open(path, O_RDONLY | O_CLOEXEC));
    if (!file) continue;  // not on this host
    const json reply = run_with_stdin(file.get());
    EXPECT_EQ(reply.value("kind", ""), "invalid") << path << ": " << reply.dump();
    EXPECT_NE(reply.value("message", "").find("stdin"), std::string::npos) << reply.dump();
  }
  expect_served(server_->socket());
}

TEST_F(ServerClientFdTest, AnonymousInodesAsStdioAreRefused) {
  std::vector<std::pair<std::string, UniqueFd>> fds;
  fds.emplace_back("epoll", UniqueFd(epoll_create1(EPOLL_CLOEXEC)));
  fds.emplace_back("eventfd", UniqueFd(eventfd(0, EFD_CLOEXEC)));
  fds.emplace_back("timerfd", UniqueFd(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC)));
  fds.emplace_back("inotify", UniqueFd(inotify_init1(IN_CLOEXEC)));
  fds.emplace_back("pidfd", UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0))));
  for (const auto& [kind, fd] : fds) {
    ASSERT_TRUE(fd) << kind;
    const json reply = run_with_stdin(fd.get());
    EXPECT_EQ(reply.value("kind", ""), "invalid") << kind << ": " << reply.dump();
    EXPECT_NE(reply.value("message", "").find("stdin"), std::string::npos) << reply.dump();
  }
}

TEST_F(ServerClientFdTest, PipesMemfdsAndFilesStillServe) {
  TempDir dir;
  dir.write("input.txt", "from a file\n");
  {  // a regular file as the payload's stdin, as it is
    UniqueFd file(open(dir.file("input.txt").c_str(), O_RDONLY | O_CLOEXEC));
    Request request;
    request.argv = {"/bin/cat"};
    request.stdin_fd = file.get();
    const Result result = ServerConnection(server_->socket()).run(request, "default");
    EXPECT_EQ(result.stdout_data, "from a file\n") << result.detail;
  }
  {  // a memfd as stdin
    UniqueFd memfd(memfd_create("stdin", MFD_CLOEXEC));
    ASSERT_EQ(write(memfd.get(), "from a memfd\n", 13), 13);
    lseek(memfd.get(), 0, SEEK_SET);
    Request request;
    request.argv = {"/bin/cat"};
    request.stdin_fd = memfd.get();
    const Result result = ServerConnection(server_->socket()).run(request, "default");
    EXPECT_EQ(result.stdout_data, "from a memfd\n") << result.detail;
  }
  {  // a pipe (stdin data is pumped through one) and /dev/null's character device
    Request request;
    request.argv = {"/bin/cat"};
    request.stdin_data = "from a pipe\n";
    const Result result = ServerConnection(server_->socket()).run(request, "default");
    EXPECT_EQ(result.stdout_data, "from a pipe\n") << result.detail;
  }
  {  // a session's context from a file in /tmp, then from a memfd
    SessionOptions options;
    options.context_file = dir.file("input.txt");
    auto session =
        ServerConnection(server_->socket()).open_session("python-repl", nullptr, options);
    EXPECT_EQ(session->execute("print(context, end='')").stdout_data, "from a file\n");
    ContextInput more;
    more.data = "from a memfd";
    EXPECT_EQ(session->add_context(ContextKind::context, more, std::nullopt).status,
              CellStatus::ok);
    EXPECT_EQ(session->execute("print(context_1)").stdout_data, "from a memfd\n");
  }
}

// ---- A session runs on the pool's backend, whatever the client's policy prefers ----

TEST(ServerSessionBackend, OverridesCannotMoveASessionToAnotherBackend) {
  TempDir dir;
  // The offer allows the local backend after the namespace backend; the pool runs on the first.
  dir.write("offer.json", R"({"extends": "python-repl",
      "backend": {"prefer": ["namespace", "local"], "allow_unisolated": true}})");
  const std::string offer = dir.file("offer.json");
  ServerUnderTest server(dir, {"--session-pool", offer + "=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  json candidate = ServerConnection(server.socket()).policy(offer).to_json();
  candidate["backend"]["prefer"] = json::array({"local"});  // a subset of the offer's: tighter?

  UniqueFd connection(connect_raw(server.socket()));
  server::send_frame(connection.get(),
                     {{"op", "session_open"},
                      {"policy", offer},
                      {"overrides", candidate},
                      {"options", {{"llm", "none"}}}},
                     Clock::now() + std::chrono::seconds(5));
  const json reply = answer(connection.get(), std::chrono::seconds(120));
  if (reply.value("op", "") != "session_opened") {
    EXPECT_EQ(reply.value("kind", ""), "refused") << reply.dump();
    return;
  }
  EXPECT_EQ(reply.value("backend", ""), "namespace") << "the client chose the session's backend";
  send_bytes(connection.get(), frame_bytes(R"({"op":"close"})"));
  EXPECT_EQ(answer(connection.get(), std::chrono::seconds(60)).value("op", ""), "closed");
}

}  // namespace
}  // namespace rlm::test
