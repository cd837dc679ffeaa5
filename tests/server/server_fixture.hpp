// A real `rlm-sandbox serve` for tests: started in a temp dir of its own, waited for until it
// answers hello, and always stopped (SIGINT, then SIGKILL) and reaped, whatever the test did.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "rlm_sandbox/client.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {

// Host pids of processes whose command line is exactly `words`.
inline std::vector<pid_t> processes_running(const std::vector<std::string>& words) {
  std::string wanted;
  for (const auto& word : words) wanted += word + '\0';
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::stringstream text;
    text << in.rdbuf();
    if (text.str() == wanted) found.push_back(std::stoi(name));
  }
  return found;
}

// Whether `condition` holds within 30 s (checked every 100 ms): what a sandbox does is seen from
// the host only after the kernel has done it (an exec's command line, a process's exit).
inline bool eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 300; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return condition();
}

// Starts argv[0] with argv, its stdout and stderr on the given fds (-1: /dev/null), stdin on
// /dev/null; as uid and gid 65534 with no supplementary groups when `as_nobody`. Returns its pid.
inline pid_t spawn(std::vector<std::string> argv, int out = -1, int err = -1,
                   bool as_nobody = false) {
  std::vector<char*> words;
  for (auto& word : argv) words.push_back(word.data());
  words.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null, 0);
    dup2(out >= 0 ? out : null, 1);
    dup2(err >= 0 ? err : null, 2);
    if (as_nobody && (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                      setresuid(65534, 65534, 65534) != 0))
      _exit(126);
    execv(words[0], words.data());
    _exit(127);
  }
  return pid;
}

// `rlm-sandbox ARGS...` with its stdout on a pipe whose read end goes to `out`.
inline pid_t spawn_cli(std::vector<std::string> args, int& out) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  const pid_t pid = spawn(std::move(args), pipe_fds[1]);
  close(pipe_fds[1]);
  out = pipe_fds[0];
  return pid;
}

// The server's log, one JSON object per line (each with its time and event).
inline std::vector<nlohmann::json> log_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(parsed.is_object()) << "not a JSON line: " << line;
    if (!parsed.is_object()) continue;
    EXPECT_TRUE(parsed.contains("time") && parsed.contains("event")) << line;
    lines.push_back(std::move(parsed));
  }
  return lines;
}

// The first line of `lines` whose fields include every one of `wanted`'s.
inline std::optional<nlohmann::json> find_line(const std::vector<nlohmann::json>& lines,
                                               const nlohmann::json& wanted) {
  for (const auto& line : lines) {
    bool all = true;
    for (const auto& [key, value] : wanted.items())
      all = all && line.value(key, nlohmann::json()) == value;
    if (all) return line;
  }
  return std::nullopt;
}

// The kind of the ServerRefused `request` throws, or "(served)" when it throws none.
inline std::string refusal_kind(const std::function<void()>& request) {
  try {
    request();
  } catch (const ServerRefused& refused) {
    return refused.kind();
  }
  return "(served)";
}

class ServerUnderTest {
 public:
  // Starts `rlm-sandbox serve --socket <dir>/s.sock ARGS...`, its stderr kept in <dir>/serve.log;
  // `launcher` (e.g. prlimit ... --) goes before it and must exec it in the same process.
  ServerUnderTest(const TempDir& dir, std::vector<std::string> args,
                  std::vector<std::string> launcher = {})
      : socket_(dir.file("s.sock")), log_(dir.file("serve.log")) {
    args.insert(args.begin(), {bin_path("rlm-sandbox"), "serve", "--socket", socket_});
    args.insert(args.begin(), launcher.begin(), launcher.end());
    start(args);
  }
  ~ServerUnderTest() { stop(); }
  ServerUnderTest(const ServerUnderTest&) = delete;
  ServerUnderTest& operator=(const ServerUnderTest&) = delete;

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::string text;
    if (FILE* file = fopen(log_.c_str(), "r")) {
      char buffer[4096];
      for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
      fclose(file);
    }
    return text;
  }
  // True once the server answered hello (within 60 s), false if it died first.
  bool ready() const { return ready_; }

  // SIGKILL, reaped: the server gets no chance to clean up.
  void kill_hard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // The exit status once the server exits by itself within `wait` (a drain); -1 when a signal
  // ended it, -2 when it did not exit in time (it is left running for stop()).
  int exited_within(std::chrono::milliseconds wait) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + wait;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -2;
  }
  // SIGINT (a clean stop at once; SIGTERM would drain), SIGKILL after 20 s; returns the exit
  // status (-1 when killed).
  int stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGINT);
    int status = 0;
    for (int i = 0; i < 2000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill_hard();
    return -1;
  }

 private:
  void start(std::vector<std::string> args) {
    const int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_ = spawn(std::move(args), -1, log);
    close(log);
    for (int i = 0; i < 600; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      try {
        ServerConnection(socket_).hello();
        ready_ = true;
        return;
      } catch (const Error&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  std::string socket_, log_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

// A suite whose tests share one server, started with Suite::server_args().
template <typename Suite>
class SharedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    server_ = std::make_unique<ServerUnderTest>(*dir_, Suite::server_args());
  }
  static void TearDownTestSuite() {
    server_.reset();
    dir_.reset();
  }
  void SetUp() override { ASSERT_TRUE(server_->ready()) << server_->log(); }
  static inline std::unique_ptr<TempDir> dir_;
  static inline std::unique_ptr<ServerUnderTest> server_;
};

}  // namespace rlm::test
