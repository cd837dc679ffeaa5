// A client never trusts whoever listens at the socket path: a process of another uid that bound
// it first (here uid 65534, in a directory any uid may write) would receive the payload's stdin
// fd and could answer with forged output. The library, the CLI and (tests/python_client) the
// Python client check the listener's uid before sending anything; the impostor counts what it
// received.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "../cli/cli_test_util.hpp"
#include "rlm_sandbox/client.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

constexpr uid_t kNobody = 65534;

// What one connection brought the impostor.
struct Received {
  long bytes = 0;
  long fds = 0;
};

// "N" for a non-negative N into `out`; returns the length. No allocation: used after fork.
int format_number(long value, char* out) {
  char digits[24];
  int count = 0;
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  for (int i = 0; i < count; ++i) out[i] = digits[count - 1 - i];
  return count;
}

// A child process as uid 65534 listening at `path`. For each connection it reads until the client
// sent one whole frame (4-byte length, then the body) or hung up, closes the connection (a client
// waiting for a reply sees the server close), and reports "BYTES FDS\n" on a pipe.
class Impostor {
 public:
  explicit Impostor(const std::string& path) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    int ready[2], report[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(report, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    child_.pid = fork();
    if (child_.pid == 0) serve(address, ready[1], report[1]);
    close(ready[1]);
    close(report[1]);
    child_.from = report[0];
    char byte = 0;
    ready_ = read(ready[0], &byte, 1) == 1 && byte == 'R';
    close(ready[0]);
  }
  Impostor(const Impostor&) = delete;
  Impostor& operator=(const Impostor&) = delete;

  bool ready() const { return ready_; }

  // The next connection's report, waiting up to 30 s for it; nullopt when none came.
  std::optional<Received> next_connection() {
    std::string line;
    while (line.empty() || line.back() != '\n') {
      pollfd p{child_.from, POLLIN, 0};
      if (poll(&p, 1, 30'000) != 1) return std::nullopt;
      char byte;
      if (read(child_.from, &byte, 1) != 1) return std::nullopt;
      line += byte;
    }
    Received received;
    if (std::sscanf(line.c_str(), "%ld %ld", &received.bytes, &received.fds) != 2)
      return std::nullopt;
    return received;
  }

 private:
  [[noreturn]] static void serve(const sockaddr_un& address, int ready, int report) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
    if (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
        setresuid(kNobody, kNobody, kNobody) != 0)
      _exit(126);
    const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0 ||
        bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        listen(listener, 8) != 0)
      _exit(125);
    if (write(ready, "R", 1) != 1) _exit(1);
    for (;;) {
      const int connection = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection < 0) {
        if (errno == EINTR) continue;
        _exit(1);
      }
      long bytes = 0, fds = 0;
      unsigned char header[4];
      static unsigned char buffer[1 << 16];
      for (;;) {
        iovec io{buffer, sizeof buffer};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
        msghdr message{};
        message.msg_iov = &io;
        message.msg_iovlen = 1;
        message.msg_control = control;
        message.msg_controllen = sizeof control;
        const ssize_t got = recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
          if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
          const auto count = static_cast<long>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
          for (long i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            close(fd);
          }
          fds += count;
        }
        for (ssize_t i = 0; i < got && bytes + i < 4; ++i) header[bytes + i] = buffer[i];
        bytes += got;
        if (bytes >= 4) {
          const long length = (long{header[0]} << 24) | (long{header[1]} << 16) |
                              (long{header[2]} << 8) | long{header[3]};
          if (bytes >= 4 + length) break;
        }
      }
      close(connection);
      char line[64];
      int size = format_number(bytes, line);
      line[size++] = ' ';
      size += format_number(fds, line + size);
      line[size++] = '\n';
      if (write(report, line, static_cast<size_t>(size)) != size) _exit(1);
    }
  }

  ChildWithPipe child_;  // the impostor, and its reports
  bool ready_ = false;
};

// Sets an environment variable for one test, restoring the old state after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class ServerImpostorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to start a process as uid 65534";
    unsetenv("RLM_SANDBOX_SERVER_UID");
    chmod(dir_.path().c_str(), 0777);  // where uid 65534 may bind
    impostor_.emplace(socket_);
    ASSERT_TRUE(impostor_->ready()) << "the impostor could not listen at " << socket_;
  }
  std::string refusal() const {
    return "the process listening at " + socket_ +
           " runs as uid 65534, not root or you; refusing to send it anything (set "
           "RLM_SANDBOX_SERVER_UID=65534 if it is yours)";
  }
  TempDir dir_;
  std::string socket_ = dir_.file("s.sock");
  std::optional<Impostor> impostor_;
};

TEST_F(ServerImpostorTest, TheLibraryRefusesAListenerOfAnotherUid) {
  try {
    ServerConnection connection(socket_);
    FAIL() << "connected to the impostor";
  } catch (const ServerRefused& refused) {
    EXPECT_EQ(refused.kind(), "unavailable");
    EXPECT_EQ(std::string(refused.what()), refusal());
  }
  auto received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_EQ(received->bytes, 0);
  EXPECT_EQ(received->fds, 0);
  // The "server" Backend too, with stdin from this process: no fd reaches the impostor.
  auto backend = make_server_client(socket_);
  Request request;
  request.argv = {"/bin/echo", "hi"};
  request.stdin_data = "input";
  EXPECT_THROW(backend->run(request, load_policy("default")), ServerRefused);
  received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_EQ(received->bytes, 0);
  EXPECT_EQ(received->fds, 0);
  EXPECT_FALSE(backend->unavailable_reason().empty());
}

TEST_F(ServerImpostorTest, TheCliRefusesItExiting125) {
  const auto outcome = cli({"run", "--server", socket_, "--", "/bin/echo", "hi"});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_NE(outcome.err.find(refusal()), std::string::npos) << outcome.err;
  EXPECT_EQ(outcome.out, "");
  auto received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_EQ(received->bytes, 0);
  EXPECT_EQ(received->fds, 0);
  // The same through $RLM_SANDBOX_SERVER, and for repl.
  ProcessOptions options;
  options.extra_env["RLM_SANDBOX_SERVER"] = socket_;
  const auto by_env = cli({"run", "--", "/bin/echo", "hi"}, options);
  EXPECT_EQ(by_env.exit_code, 125) << by_env.err;
  EXPECT_NE(by_env.err.find(refusal()), std::string::npos) << by_env.err;
  received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_EQ(received->bytes, 0);
  const auto repl = cli({"repl", "--server", socket_});
  EXPECT_NE(repl.exit_code, 0);
  EXPECT_NE((repl.out + repl.err).find(refusal()), std::string::npos) << repl.out << repl.err;
  received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_EQ(received->bytes, 0);
  EXPECT_EQ(received->fds, 0);
}

// Told to expect uid 65534, the client connects and sends (the impostor then hangs up).
TEST_F(ServerImpostorTest, AServerUidTheClientIsToldToExpectIsUsed) {
  EXPECT_THROW(ServerConnection(socket_, kNobody).hello(), ServerRefused);
  auto received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_GT(received->bytes, 4);
  {
    ScopedEnv expect("RLM_SANDBOX_SERVER_UID", "65534");
    try {
      ServerConnection(socket_).hello();
      FAIL() << "the impostor answered hello";
    } catch (const ServerRefused& refused) {
      EXPECT_NE(std::string(refused.what()).find("closed the connection"), std::string::npos)
          << refused.what();
    }
    received = impostor_->next_connection();
    ASSERT_TRUE(received);
    EXPECT_GT(received->bytes, 4);
  }
  // The CLI with --server-uid: the run's request goes out, with the payload's stdio as fds.
  const auto outcome =
      cli({"run", "--server", socket_, "--server-uid", "65534", "--", "/bin/echo", "hi"});
  EXPECT_EQ(outcome.exit_code, 125) << outcome.err;
  EXPECT_EQ(outcome.err.find("refusing to send"), std::string::npos) << outcome.err;
  received = impostor_->next_connection();
  ASSERT_TRUE(received);
  EXPECT_GT(received->bytes, 4);
  EXPECT_GE(received->fds, 2);
  // A value that is not a uid is an error, not a silent default.
  const auto bad = cli({"run", "--server", socket_, "--server-uid", "nobody", "--", "/bin/true"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("not a uid"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace rlm::test
