// A real `rlm-sandbox serve` for tests that go through the server: started on a socket in a
// temporary directory, waited for until it accepts, and stopped (SIGINT, then SIGKILL) with its
// directory removed when the object goes. The child asks the kernel for SIGTERM should the test
// process die first, so a crashed test leaves no server behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "support/subprocess.hpp"

namespace rlm::test {

// A TLS listener beside the socket (--listen 127.0.0.1:0): certificates made fresh in the
// server's directory by tests/server/make_tls_certs.sh, and the identities "alice" and "bob"
// standing for these uids; with `client_crl`, the CA's revocation list (tls/crl.pem, revoking
// the certificate "revoked") given as --client-crl.
struct TlsListenerSetup {
  uid_t alice_uid = 0;
  uid_t bob_uid = 65534;
  bool client_crl = false;
};

class ServerProcess {
 public:
  // `args` follow `rlm-sandbox serve --socket <dir>/server.sock`. Throws std::runtime_error with
  // the server's stderr when it exits or does not listen within `ready_within`.
  explicit ServerProcess(const std::vector<std::string>& args,
                         std::chrono::milliseconds ready_within = std::chrono::seconds(60),
                         std::optional<TlsListenerSetup> tls = std::nullopt);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& socket() const { return socket_; }
  // With a TLS listener: "tls://127.0.0.1:PORT", and the directory of its certificates (ca.pem,
  // alice.pem/.key, bob, nobody, stranger: make_tls_certs.sh).
  const std::string& tls_endpoint() const { return tls_endpoint_; }
  std::string tls_file(const std::string& name) const { return dir_.file("tls/" + name); }
  pid_t pid() const { return pid_; }
  // What the server wrote to stderr so far.
  std::string log() const;

 private:
  void stop();

  TempDir dir_;
  std::string socket_;
  std::string tls_endpoint_;
  pid_t pid_ = -1;
};

}  // namespace rlm::test
