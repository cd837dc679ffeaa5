// A real `rlm-sandbox serve` for tests that go through the server: started on a socket in a
// temporary directory, waited for until it accepts, and stopped (SIGINT, then SIGKILL) with its
// directory removed when the object goes. The child asks the kernel for SIGTERM should the test
// process die first, so a crashed test leaves no server behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/subprocess.hpp"

namespace rlm::test {

class ServerProcess {
 public:
  // `args` follow `rlm-sandbox serve --socket <dir>/server.sock`. Throws std::runtime_error with
  // the server's stderr when it exits or does not listen within `ready_within`.
  explicit ServerProcess(const std::vector<std::string>& args,
                         std::chrono::milliseconds ready_within = std::chrono::seconds(60));
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  // What the server wrote to stderr so far.
  std::string log() const;

 private:
  void stop();

  TempDir dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace rlm::test
