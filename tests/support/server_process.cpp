#include "support/server_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <thread>

namespace rlm::test {
namespace {

bool accepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

ServerProcess::ServerProcess(const std::vector<std::string>& args,
                             std::chrono::milliseconds ready_within,
                             std::optional<TlsListenerSetup> tls) {
  ::chmod(dir_.path().c_str(), 0755);
  socket_ = dir_.file("server.sock");
  std::vector<std::string> argv = {bin_path("rlm-sandbox"), "serve", "--socket", socket_};
  argv.insert(argv.end(), args.begin(), args.end());
  if (tls) {
    const ProcessOutcome outcome =
        run_process({"/bin/sh", source_path("tests/server/make_tls_certs.sh"), dir_.file("tls")});
    if (outcome.exit_code != 0)
      throw std::runtime_error("make_tls_certs.sh failed: " + outcome.err);
    argv.insert(argv.end(), {"--listen", "127.0.0.1:0", "--tls-cert", tls_file("node.pem"),
                             "--tls-key", tls_file("node.key"), "--client-ca", tls_file("ca.pem"),
                             "--tls-identity", "alice=" + std::to_string(tls->alice_uid),
                             "--tls-identity", "bob=" + std::to_string(tls->bob_uid)});
    if (tls->client_crl) argv.insert(argv.end(), {"--client-crl", tls_file("crl.pem")});
  }
  std::vector<char*> pointers;
  for (auto& arg : argv) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  const std::string log_path = dir_.file("server.log");
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) throw std::runtime_error("cannot create " + log_path);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {  // async-signal-safe only until exec
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(log_fd, 2);
    ::execv(pointers[0], pointers.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  const auto deadline = std::chrono::steady_clock::now() + ready_within;
  while (!accepts(socket_)) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("rlm-sandbox serve exited before it listened: " + log());
    }
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string text = log();
      stop();
      throw std::runtime_error("rlm-sandbox serve did not listen in time: " + text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The listener's port, from the server's "listening" line (written once it serves).
  while (tls && tls_endpoint_.empty()) {
    const std::string text = log();
    constexpr std::string_view kKey = "\"tls\":\"";
    if (const auto at = text.find(kKey); at != std::string::npos) {
      const auto end = text.find('"', at + kKey.size());
      if (end != std::string::npos)
        tls_endpoint_ = "tls://" + text.substr(at + kKey.size(), end - at - kKey.size());
    } else if (std::chrono::steady_clock::now() > deadline) {
      stop();
      throw std::runtime_error("rlm-sandbox serve did not say its TLS address: " + text);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

ServerProcess::~ServerProcess() {
  stop();
}

std::string ServerProcess::log() const {
  return dir_.read("server.log");
}

void ServerProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGINT);  // a stop at once (SIGTERM drains)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) != pid_) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
}

}  // namespace rlm::test
