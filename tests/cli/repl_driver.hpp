// An interactive `rlm-sandbox repl` for tests: request lines in, event lines out.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_test_util.hpp"

namespace rlm::test {

// An interactive rlm-sandbox repl: write a request line, read event lines.
class Repl {
 public:
  explicit Repl(std::vector<std::string> args) {
    int in[2], out[2];
    EXPECT_EQ(pipe2(in, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    args.insert(args.begin(), {bin_path("rlm-sandbox"), "repl"});
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Repl() {
    if (to_ >= 0) close(to_);
    close(from_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void send(const nlohmann::json& line) {
    const auto text = line.dump() + "\n";
    ASSERT_EQ(write(to_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  void end_input() {
    close(to_);
    to_ = -1;
  }

  // The next line, or null after 30 s or at EOF.
  nlohmann::json next() {
    for (;;) {
      if (auto newline = buffer_.find('\n'); newline != std::string::npos) {
        auto line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return nlohmann::json::parse(line);
      }
      pollfd readable{from_, POLLIN, 0};
      if (poll(&readable, 1, 30'000) <= 0) return nlohmann::json();
      char chunk[4096];
      const ssize_t count = read(from_, chunk, sizeof chunk);
      if (count <= 0) return nlohmann::json();
      buffer_.append(chunk, static_cast<std::size_t>(count));
    }
  }

  // SIGKILLs the repl, as the OOM killer or a crashing orchestrator would, and reaps it.
  void kill_now() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  int wait_exit() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffer_;
};

}  // namespace rlm::test
