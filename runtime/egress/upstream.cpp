#include "egress/upstream.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "protocols/dns_message.hpp"
#include "protocols/host_name.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::egress {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<std::vector<IpAddress>> ask(const UpstreamSettings& settings, int fd,
                                          const std::string& name, std::uint16_t type, int stop_fd,
                                          std::string& why) {
  std::uint16_t id = 0;
  if (getrandom(&id, sizeof id, 0) != sizeof id) id = static_cast<std::uint16_t>(getpid());
  const auto request = protocols::build_dns_request(id, name, type);
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    why = "cannot send to the resolver: " + sys::errno_text(errno);
    return std::nullopt;
  }
  const auto deadline = Clock::now() + settings.resolve_timeout;
  std::vector<std::uint8_t> buffer(protocols::kDnsMaxMessage);
  for (;;) {
    if (!wait_for(fd, POLLIN, stop_fd, deadline)) {
      why = "the resolver did not answer in time";
      return std::nullopt;
    }
    const ssize_t got = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) {
      why = "the resolver: " + sys::errno_text(errno);
      return std::nullopt;
    }
    std::string mismatch;
    // An answer for another id or question is someone else's (or a spoof): keep waiting.
    const auto answer = protocols::parse_dns_answer(
        std::span(buffer.data(), static_cast<std::size_t>(got)), id, name, type, mismatch);
    if (!answer) continue;
    std::vector<IpAddress> addresses;
    for (const auto& bytes : answer->addresses) {
      IpAddress address;
      address.bytes = bytes;
      address.ipv6 = type == protocols::kDnsTypeAaaa;
      addresses.push_back(address);
    }
    return addresses;
  }
}

std::vector<IpAddress> resolve_with(const UpstreamSettings& settings, const std::string& name,
                                    int stop_fd, std::string& why) {
  sockaddr_storage server;
  const socklen_t length = to_sockaddr(*settings.resolver, server);
  host::UniqueFd fd(socket(server.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd || connect(fd.get(), reinterpret_cast<sockaddr*>(&server), length) != 0) {
    why = "cannot reach the resolver " + to_string(settings.resolver->address) + ": " +
          sys::errno_text(errno);
    return {};
  }
  std::vector<IpAddress> all;
  for (const auto type : {protocols::kDnsTypeA, protocols::kDnsTypeAaaa}) {
    auto found = ask(settings, fd.get(), name, type, stop_fd, why);
    if (!found) return {};
    all.insert(all.end(), found->begin(), found->end());
  }
  if (all.empty()) why = "the resolver has no address for " + name;
  return all;
}

std::vector<IpAddress> resolve_on_host(const std::string& name, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(name.c_str(), nullptr, &hints, &found); error != 0) {
    why = std::string("cannot resolve ") + name + ": " + gai_strerror(error);
    return {};
  }
  std::vector<IpAddress> v4, v6;
  for (const addrinfo* entry = found; entry; entry = entry->ai_next) {
    sockaddr_storage address{};
    std::memcpy(&address, entry->ai_addr, std::min<std::size_t>(entry->ai_addrlen, sizeof address));
    if (const auto endpoint = endpoint_from(address))
      (endpoint->address.ipv6 ? v6 : v4).push_back(endpoint->address);
  }
  freeaddrinfo(found);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

}  // namespace

UpstreamSettings UpstreamSettings::from_environment() {
  UpstreamSettings settings;
  if (const char* text = std::getenv("RLM_SANDBOX_RESOLVER"); text && *text) {
    settings.resolver = parse_endpoint(text);
    if (!settings.resolver)
      throw Error(std::string("RLM_SANDBOX_RESOLVER=") + text +
                  ": expected an address and port, e.g. 127.0.0.1:5353 or [::1]:53");
  }
  if (const char* text = std::getenv("RLM_SANDBOX_UPSTREAM_CA"); text && *text) {
    if (text[0] != '/')
      throw Error(std::string("RLM_SANDBOX_UPSTREAM_CA=") + text +
                  ": expected the absolute path of a PEM CA bundle");
    settings.ca_file = text;
  }
  return settings;
}

bool wait_for(int fd, short events, int stop_fd, Clock::time_point deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int ready = poll(fds, stop_fd >= 0 ? 2 : 1, sys::poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    if (stop_fd >= 0 && fds[1].revents) return false;
    return fds[0].revents != 0;
  }
}

std::vector<IpAddress> resolve(const UpstreamSettings& settings, const std::string& name,
                               int stop_fd, std::string& why) {
  // Never anything but a host name: getaddrinfo would read a NUL as the end, and digits alone as
  // an address.
  if (protocols::normalize_host_name(name) != name ||
      name.find_first_not_of("0123456789.") == std::string::npos) {
    why = "not a host name";
    return {};
  }
  return settings.resolver ? resolve_with(settings, name, stop_fd, why)
                           : resolve_on_host(name, why);
}

host::UniqueFd connect_upstream(const UpstreamSettings& settings, const Endpoint& endpoint,
                                int stop_fd, std::string& why) {
  sockaddr_storage address;
  const socklen_t length = to_sockaddr(endpoint, address);
  host::UniqueFd fd(socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    why = "socket: " + sys::errno_text(errno);
    return {};
  }
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0 &&
      errno != EINPROGRESS) {
    why = "connect: " + sys::errno_text(errno);
    return {};
  }
  if (!wait_for(fd.get(), POLLOUT, stop_fd, Clock::now() + settings.connect_timeout)) {
    why = "connect: timed out";
    return {};
  }
  int error = 0;
  socklen_t size = sizeof error;
  if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size) != 0 || error != 0) {
    why = "connect: " + sys::errno_text(error ? error : errno);
    return {};
  }
  return fd;
}

}  // namespace rlm::egress
