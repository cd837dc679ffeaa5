#include "http/echo_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace rlm::test {

EchoServer::EchoServer() : unix_socket_(directory_.file("server.sock")) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  stdin_ = in_pipe[1];
  const int child_stdin = in_pipe[0], child_stdout = out_pipe[1], stdout_read = out_pipe[0];

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_stdin, 0);
  posix_spawn_file_actions_adddup2(&actions, child_stdout, 1);
  std::string script = source_path("tests/http/echo_server.py");
  std::string python = "python3";
  char* argv[] = {python.data(), script.data(), unix_socket_.data(), nullptr};
  const int spawn_error = posix_spawnp(&pid_, "python3", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(child_stdin);
  close(child_stdout);
  if (spawn_error != 0) {
    close(stdout_read);
    close(stdin_);
    throw std::runtime_error("cannot start python3 for the echo server");
  }

  // The first line is {"port": N}; EOF before it means the server failed to start.
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{stdout_read, POLLIN, 0};
    const bool ready = left.count() > 0 && poll(&readable, 1, static_cast<int>(left.count())) > 0;
    char buffer[256];
    const ssize_t got = ready ? read(stdout_read, buffer, sizeof buffer) : 0;
    if (got <= 0) {
      close(stdout_read);
      stop();
      throw std::runtime_error("the echo server did not start (see its stderr)");
    }
    line.append(buffer, static_cast<size_t>(got));
  }
  close(stdout_read);
  port_ = nlohmann::json::parse(line.substr(0, line.find('\n'))).at("port").get<int>();
}

EchoServer::~EchoServer() {
  stop();
}

void EchoServer::stop() {
  close(stdin_);
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

std::string EchoServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + path;
}

}  // namespace rlm::test
