#include "session/rendezvous.hpp"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "session/frame_fields.hpp"

namespace rlm::session {
namespace {

using Clock = std::chrono::steady_clock;
using host::UniqueFd;
using nlohmann::json;

Error system_error(const char* what) {
  return Error(std::string(what) + ": " + sys::errno_text(errno));
}

// The first frame on a fresh connection, waiting until `deadline`; nullopt at the deadline or EOF
// without one. Throws Error for a malformed frame.
std::optional<json> first_frame(Channel& channel, Clock::time_point deadline) {
  for (;;) {
    if (auto frame = channel.next_frame()) return frame;
    const int timeout = sys::poll_timeout_ms(deadline);  // what is left, plus 1 ms
    pollfd readable{channel.fd(), POLLIN, 0};
    if (timeout <= 1 || poll(&readable, 1, timeout) <= 0) return std::nullopt;
    if (!channel.receive()) return channel.next_frame();  // EOF: a last complete frame counts
  }
}

}  // namespace

std::string random_token() {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    throw system_error("getrandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (const unsigned char byte : bytes) {
    token += kHex[byte >> 4];
    token += kHex[byte & 15];
  }
  return token;
}

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;  // constant time: the comparison does not stop at the first miss
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

Rendezvous::Rendezvous(const SessionOptions& options) : max_frame_(options.max_frame_bytes) {
  char pattern[] = "/tmp/rlm-session-XXXXXX";
  if (!mkdtemp(pattern)) throw system_error("mkdtemp");
  dir_ = pattern;
  // The sandbox user (any uid) must reach the socket; other host users cannot list the
  // directory, and a connection without the token is dropped.
  chmod(dir_.c_str(), 0711);
  listener_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_) throw system_error("socket");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = dir_ + "/channel.sock";
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
  if (bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      chmod(path.c_str(), 0666) != 0 || listen(listener_.get(), 4) != 0)
    throw system_error("binding the session socket");
}

Rendezvous::~Rendezvous() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Mount Rendezvous::mount() const {
  Mount mount;
  mount.type = Mount::Type::bind;
  mount.source = dir_;
  mount.target = kInside;
  mount.readonly = false;  // connect() needs write access to the socket
  return mount;
}

std::optional<json> Rendezvous::accept_hello(const std::string& token, int done_fd,
                                             Clock::time_point deadline, Channel& channel) {
  for (;;) {
    const int timeout = sys::poll_timeout_ms(deadline);  // what is left, plus 1 ms
    if (timeout <= 1) return std::nullopt;
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {done_fd, POLLIN, 0}};
    if (poll(fds, 2, timeout) <= 0) continue;
    if (fds[1].revents) return std::nullopt;
    UniqueFd peer(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer) continue;
    Channel candidate(std::move(peer), max_frame_);
    std::optional<json> hello;
    try {
      hello = first_frame(candidate, deadline);
    } catch (const Error&) {
      continue;  // garbage from whoever connected: not our worker
    }
    if (hello && text_field(*hello, "type") == "hello" &&
        same_token(text_field(*hello, "token"), token)) {
      channel = std::move(candidate);
      listener_.reset();  // nobody else gets in
      return hello;
    }
  }
}

}  // namespace rlm::session
