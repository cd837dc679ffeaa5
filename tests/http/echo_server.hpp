// tests/http/echo_server.py, started for a test suite: an HTTP server on 127.0.0.1 and on a unix
// socket that echoes what it receives (see the script for its paths).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "support/subprocess.hpp"

namespace rlm::test {

class EchoServer {
 public:
  EchoServer();  // returns once the server listens; throws std::runtime_error when it cannot start
  ~EchoServer();
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  std::string url(const std::string& path) const;  // url("/v1/chat/completions") over TCP
  const std::string& unix_socket() const { return unix_socket_; }

 private:
  void stop();

  TempDir directory_;
  std::string unix_socket_;
  pid_t pid_ = -1;
  int port_ = 0;
  int stdin_ = -1;  // the server exits when this closes
};

// A test suite whose tests share one EchoServer, started before the first and stopped after the
// last: `class MySuite : public WithEchoServer {...}`, then server() in the tests.
class WithEchoServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = std::make_unique<EchoServer>(); }
  static void TearDownTestSuite() { server_.reset(); }
  static const EchoServer& server() { return *server_; }

 private:
  static inline std::unique_ptr<EchoServer> server_;
};

}  // namespace rlm::test
