// Runs through the server: the payload's stdio are the client's own fds (output streams without
// crossing the server), the output cap truncates as in a direct run, a client that leaves stops
// its run, and two clients are served at the same time.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "../cli/cli_test_util.hpp"
#include "rlm_sandbox/client.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

class ServerRunTest : public SharedServerTest<ServerRunTest> {
 public:
  static std::vector<std::string> server_args() { return {"--pool", "default=2"}; }
};

TEST_F(ServerRunTest, OutputStreamsAndExitStatusAsADirectRun) {
  auto outcome = cli({"run", "--server", server_->socket(), "--", "/bin/sh", "-c",
                      "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(outcome.exit_code, 3) << outcome.err;
  EXPECT_EQ(outcome.out, "out\n");
  EXPECT_EQ(outcome.err, "err\n");
}

// `run [--server S] [--policy P] -- CMD` is read by a short path of its own (run_command.cpp);
// every spelling of it must do what the general parser does (which a neutral flag forces).
TEST_F(ServerRunTest, ThePlainFormMeansWhatTheGeneralParserMakesOfIt) {
  const std::vector<std::string> payload = {"--", "/bin/sh", "-c",
                                            "echo out; echo err >&2; exit 3"};
  const auto with = [&](std::vector<std::string> words) {
    words.insert(words.begin(), "run");
    words.insert(words.end(), payload.begin(), payload.end());
    return words;
  };
  const auto general = cli(with({"--server", server_->socket(), "--backend", "auto"}));
  ASSERT_EQ(general.exit_code, 3) << general.err;
  ProcessOptions from_environment;
  from_environment.extra_env["RLM_SANDBOX_SERVER"] = server_->socket();
  for (const auto& [words, options] :
       std::vector<std::pair<std::vector<std::string>, ProcessOptions>>{
           {{"--server", server_->socket()}, {}},
           {{"--server", server_->socket(), "--policy", "default"}, {}},
           {{"-p", "default", "--server", server_->socket()}, {}},
           {{}, from_environment},
           {{"--policy", "default"}, from_environment}}) {
    const auto plain = cli(with(words), options);
    EXPECT_EQ(plain.exit_code, general.exit_code) << plain.err;
    EXPECT_EQ(plain.out, general.out);
    EXPECT_EQ(plain.err, general.err);
  }
  // Without "--" the options end at the command, and its own options stay its own, both ways.
  for (const bool plain : {true, false}) {
    std::vector<std::string> words{
        "run", "--server", server_->socket(), "/bin/sh", "-c", "echo \"$0 $1\"", "-p", "--json"};
    if (!plain) words.insert(words.begin() + 3, {"--backend", "auto"});
    const auto outcome = cli(words);
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    EXPECT_EQ(outcome.out, "-p --json\n") << (plain ? "plain form" : "general parser");
  }
  // A refusal reads the same both ways too.
  const auto refused = cli(with({"--server", server_->socket(), "-p", "strict"}));
  const auto refused_general =
      cli(with({"--server", server_->socket(), "-p", "strict", "--backend", "auto"}));
  EXPECT_EQ(refused.exit_code, 125);
  EXPECT_EQ(refused.exit_code, refused_general.exit_code);
  EXPECT_EQ(refused.err, refused_general.err);
  EXPECT_NE(refused.err.find("strict"), std::string::npos) << refused.err;
}

// A finished connection's thread waits for the next one (a few at most) instead of exiting: one
// client after another is served by the same thread, and after some at once no more than four
// spares stay.
TEST_F(ServerRunTest, ConnectionThreadsAreReusedAndBounded) {
  // The server's connection threads ("rlm-connection"), by thread id.
  const auto connection_threads = [&] {
    std::set<std::string> ids;
    for (const auto& entry :
         std::filesystem::directory_iterator("/proc/" + std::to_string(server_->pid()) + "/task")) {
      std::ifstream comm(entry.path() / "comm");
      std::string name;
      std::getline(comm, name);
      if (name == "rlm-connection") ids.insert(entry.path().filename());
    }
    return ids;
  };
  ASSERT_EQ(cli({"run", "--server", server_->socket(), "--", "/bin/true"}).exit_code, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (connection_threads().empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto spare = connection_threads();
  ASSERT_FALSE(spare.empty()) << "the first connection's thread did not stay as a spare";
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(cli({"run", "--server", server_->socket(), "--", "/bin/true"}).exit_code, 0);
  // The first spare is still there, serving (a client that connects before the last one's thread
  // is back waiting gets a thread of its own, which then stays as a spare too: at most four).
  const auto after = connection_threads();
  for (const auto& id : spare)
    EXPECT_EQ(after.count(id), 1u) << "the spare thread " << id << " exited instead of serving";
  EXPECT_LE(after.size(), 4u);

  int outs[6];
  std::vector<pid_t> clients;
  for (int& out : outs)
    clients.push_back(spawn_cli({"run", "--server", server_->socket(), "--", "/bin/true"}, out));
  for (std::size_t i = 0; i < clients.size(); ++i) {
    int status = 0;
    waitpid(clients[i], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(outs[i]);
  }
  const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (connection_threads().size() > 4 && std::chrono::steady_clock::now() < settle)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LE(connection_threads().size(), 4u);
}

TEST_F(ServerRunTest, StdinReachesThePayload) {
  ProcessOptions options;
  options.stdin_data = "from the client\n";
  auto outcome = cli({"run", "--server", server_->socket(), "--", "/bin/cat"}, options);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "from the client\n");
}

TEST_F(ServerRunTest, JsonResultCarriesTheOutput) {
  auto outcome = cli({"run", "--server", server_->socket(), "--json", "--code",
                      "import sys; print('hi'); sys.exit(4)"});
  EXPECT_EQ(outcome.exit_code, 4) << outcome.err;
  const auto result = json::parse(outcome.out);
  EXPECT_EQ(result["status"], "exit_nonzero");
  EXPECT_EQ(result["stdout"], "hi\n");
  EXPECT_EQ(result["policy"], "default");
}

TEST_F(ServerRunTest, OutputCapTruncatesAsADirectRunDoes) {
  const std::vector<std::string> payload = {"--json", "--", "/bin/sh", "-c",
                                            "head -c 3000000 /dev/zero | tr '\\0' x; sleep 5"};
  auto via_server = payload;
  via_server.insert(via_server.begin(), {"run", "--server", server_->socket()});
  auto direct = payload;
  direct.insert(direct.begin(), "run");
  const auto served = json::parse(cli(via_server).out);
  const auto local = json::parse(cli(direct).out);
  EXPECT_EQ(served["status"], "output_limit") << served.dump().substr(0, 400);
  EXPECT_EQ(served["status"], local["status"]);
  EXPECT_TRUE(served["stdout_truncated"].get<bool>());
  EXPECT_EQ(served["stdout"].get<std::string>().size(), 1u << 20);
  EXPECT_EQ(served["stdout"], local["stdout"]);
  EXPECT_EQ(served["detail"], local["detail"]);
}

TEST_F(ServerRunTest, LibraryClientIsABackend) {
  auto backend = make_server_client(server_->socket());
  EXPECT_EQ(backend->name(), "server");
  EXPECT_EQ(backend->unavailable_reason(), "");
  Request request;
  request.argv = {"/bin/sh", "-c", "read line; echo got $line; echo warn >&2"};
  request.stdin_data = "it\n";
  std::string streamed_err;
  request.on_stderr = [&](std::string_view data) { streamed_err += data; };
  const Result result = backend->run(request, load_policy("default"));
  EXPECT_EQ(result.status, Status::ok) << result.detail;
  EXPECT_EQ(result.stdout_data, "got it\n");
  EXPECT_EQ(result.stderr_data, "");
  EXPECT_EQ(streamed_err, "warn\n");
}

TEST_F(ServerRunTest, TimeoutAndTighterLimitsHold) {
  auto outcome =
      cli({"run", "--server", server_->socket(), "--timeout", "300ms", "--", "/bin/sleep", "5"});
  EXPECT_EQ(outcome.exit_code, 124) << outcome.err;
}

// Init's report line names the path it could not execute (each byte outside ASCII as \u00XX).
// A long path must neither make the line longer than the runtime keeps of a report (the run then
// ended as "ended without a report") nor keep the run from ending at the report's newline: a
// pool's init stays after its report (--hold-after-report), and a run that waited for init's exit
// lasted until its wall-time limit and said "timeout". Through the server and directly.
TEST_F(ServerRunTest, AReportLongerThanTheRuntimeKeepsStillEndsTheRun) {
  std::string ascii, accented;
  for (int i = 0; i < 16; ++i) ascii += "/" + std::string(250, 'a');
  ascii += "/" + std::string(70, 'b');  // 4087 bytes: under PATH_MAX, so exec fails with ENOENT
  for (int i = 0; i < 4; ++i) {
    accented += "/";
    for (int j = 0; j < 120; ++j) accented += "\xc3\xa9";  // é: 960 bytes, 5760 once escaped
  }
  for (const auto& path : {ascii, accented}) {
    for (const bool via_server : {true, false}) {
      std::vector<std::string> words{"run", "--timeout", "8s", "--", path};
      if (via_server) words.insert(words.begin() + 1, {"--server", server_->socket()});
      const auto outcome = cli(words);
      EXPECT_EQ(outcome.exit_code, 127) << (via_server ? "server: " : "direct: ") << outcome.err;
      EXPECT_NE(outcome.err.find("cannot execute"), std::string::npos) << outcome.err;
    }
  }
}

// A signal to a client stops its run on the server as it would a direct one: the client sends
// a stop, the payload gets SIGTERM and its grace there, and the Result says interrupted.
TEST_F(ServerRunTest, ASignalToTheClientStopsTheRunAsInterrupted) {
  RunningCli run({"run", "--server", server_->socket(), "--", "sh", "-c",
                  "trap 'echo got TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done"});
  ASSERT_TRUE(run.wait_for("up\n"));
  kill(run.pid(), SIGINT);
  EXPECT_EQ(run.finish(), 130);
  EXPECT_EQ(run.out(), "up\ngot TERM\n");
}

// A client's own stdin pipe never reaches the sandbox: it is pumped through a pipe of the
// client library's. Passed as it was, and opened by path (/dev/stdin), it let the payload write
// into the caller's input, which the caller's next reader took (`... | while read` ran a line the
// payload chose; found by attacking it).
TEST_F(ServerRunTest, APayloadCannotWriteIntoTheCallersStdin) {
  int input[2];
  ASSERT_EQ(pipe2(input, O_CLOEXEC), 0);
  ASSERT_EQ(write(input[1], "first\n", 6), 6);
  const std::string binary = bin_path("rlm-sandbox");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(input[0], 0);
    execl(binary.c_str(), binary.c_str(), "run", "--server", server_->socket().c_str(), "--", "sh",
          "-c", "read a; echo \"got $a\"; echo injected > /dev/stdin", nullptr);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  close(input[1]);
  char left[64] = {};
  const ssize_t got = read(input[0], left, sizeof left - 1);
  EXPECT_LE(got, 0) << "the caller's stdin holds what the payload wrote: " << left;
  close(input[0]);
}

// Two clients at once: the second run completes while the first is still running.
TEST_F(ServerRunTest, TwoClientsAreServedInParallel) {
  int out = -1;
  const pid_t first = spawn_cli(
      {"run", "--server", server_->socket(), "--", "/bin/sh", "-c", "echo up; exec sleep 60"}, out);
  ASSERT_GT(first, 0);
  char up[3] = {};
  ASSERT_EQ(read(out, up, 3), 3);  // the first run's payload is running
  auto second = cli({"run", "--server", server_->socket(), "--", "/bin/echo", "second"});
  EXPECT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, "second\n");
  int status = 0;
  EXPECT_EQ(waitpid(first, &status, WNOHANG), 0) << "the first run is still running";
  // The first client leaves: its run is stopped, its payload gone.
  kill(first, SIGKILL);
  waitpid(first, &status, 0);
  // Its payload (sleep 60) held the pipe: EOF well before 60 s means the server stopped it.
  pollfd entry{out, POLLIN, 0};
  ASSERT_EQ(poll(&entry, 1, 20'000), 1) << "the payload still runs after its client left";
  char rest[16];
  EXPECT_EQ(read(out, rest, sizeof rest), 0);
  close(out);
}

}  // namespace
}  // namespace rlm::test
