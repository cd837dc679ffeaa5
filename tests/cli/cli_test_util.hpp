// Helpers for tests that drive the rlm-sandbox binary the way a user or a script does.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "support/subprocess.hpp"

namespace rlm::test {

inline ProcessOutcome cli(std::vector<std::string> args, const ProcessOptions& options = {}) {
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  return run_process(args, options);
}

// `rlm-sandbox ARGS...` started with its stdout on a pipe (stdin and stderr /dev/null), for a test
// that acts on it while it runs: wait for a line, send a signal, then collect the rest.
class RunningCli {
 public:
  explicit RunningCli(std::vector<std::string> args) {
    args.insert(args.begin(), bin_path("rlm-sandbox"));
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (auto& word : args) argv.push_back(word.data());
    argv.push_back(nullptr);
    if (posix_spawn(&child_.pid, argv[0], &actions, nullptr, argv.data(), environ) != 0)
      child_.pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    child_.from = out[0];
  }

  pid_t pid() const { return child_.pid; }
  // Reads stdout until it holds `text` (or ends); true when it does.
  bool wait_for(const std::string& text) {
    char buffer[4096];
    while (out_text_.find(text) == std::string::npos) {
      const ssize_t got = read(child_.from, buffer, sizeof buffer);
      if (got <= 0) return false;
      out_text_.append(buffer, static_cast<std::size_t>(got));
    }
    return true;
  }
  // Reads stdout to its end and reaps the CLI: its exit status (-1 when a signal killed it).
  int finish() {
    wait_for(std::string(1, '\0'));  // never printed: reads to EOF
    int status = 0;
    waitpid(child_.pid, &status, 0);
    child_.pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  const std::string& out() const { return out_text_; }

 private:
  ChildWithPipe child_;  // the CLI, and its stdout
  std::string out_text_;
};

// The CLI printed exactly one line on stderr (a message a person can act on, not a dump).
inline bool one_line(const std::string& text) {
  return !text.empty() && text.find('\n') == text.size() - 1;
}

}  // namespace rlm::test
