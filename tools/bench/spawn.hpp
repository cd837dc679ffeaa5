// How every bench times a whole command: posix_spawn + exec + wait4, stdio on /dev/null, the way
// rlm-bench has timed its bubblewrap line from the start. posix_spawn (vfork semantics) keeps the
// harness's own cost -- copying a large bench process's page tables in fork() -- out of both the
// measured column and its baseline.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace rlm::bench {

struct Sample {
  double wall_ms = 0;
  double cpu_ms = 0;
};

inline double ms_of(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) * 1e3 + static_cast<double>(tv.tv_usec) / 1e3;
}

// One posix_spawn+exec+wait of argv with stdio on /dev/null (stderr into `err` when given). Returns
// the wall and CPU time in milliseconds, or nullopt when the command did not exit 0.
inline std::optional<Sample> spawn_once(const std::vector<std::string>& argv,
                                        std::string* err = nullptr) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);

  int err_pipe[2] = {-1, -1};
  if (err && ::pipe2(err_pipe, O_CLOEXEC) != 0) err = nullptr;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  if (err)
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  else
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);

  auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  int spawn_error = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  int status = 0;
  rusage usage{};
  if (spawn_error == 0)
    while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
    }
  auto end = std::chrono::steady_clock::now();
  posix_spawn_file_actions_destroy(&actions);

  if (err) {
    ::close(err_pipe[1]);
    char buf[4096];
    for (ssize_t n; (n = ::read(err_pipe[0], buf, sizeof buf)) > 0;)
      err->append(buf, static_cast<size_t>(n));
    ::close(err_pipe[0]);
    if (spawn_error != 0) *err = argv[0] + ": " + std::strerror(spawn_error);
  }
  if (spawn_error != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (err && err->empty())
      *err = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                               : "killed by signal " + std::to_string(WTERMSIG(status));
    return std::nullopt;
  }
  return Sample{std::chrono::duration<double, std::milli>(end - start).count(),
                ms_of(usage.ru_utime) + ms_of(usage.ru_stime)};
}

}  // namespace rlm::bench
