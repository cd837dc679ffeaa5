#include "egress/proxy.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <mutex>

#include "egress/account.hpp"
#include "egress/connection.hpp"
#include "egress/dns_stub.hpp"
#include "egress/synthetic_names.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::egress {
namespace {

// How long stop() waits for connections' threads: each ends at its next wait once the stop
// signal is up, except one inside the host's resolver (getaddrinfo has no cancel), which ends on
// its own and holds only the shared state.
constexpr std::chrono::seconds kStopWait{5};
constexpr int kDatagramsPerWake = 64;  // then the other listeners get their turn

bool is_datagram(int fd) {
  int type = 0;
  socklen_t length = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0 && type == SOCK_DGRAM;
}

}  // namespace

struct EgressProxy::Shared {
  Shared(const Egress& policy, UpstreamSettings settings,
         std::shared_ptr<const Credentials> injected)
      : credentials(std::move(injected)),
        rules(policy),
        limits(policy.limits),
        names(policy.limits.names),
        dns(rules, names, account),
        upstream(std::move(settings)) {}
  const std::shared_ptr<const Credentials> credentials;
  LiveRules rules;
  const EgressLimits limits;  // a narrowing keeps them
  SyntheticNames names;
  Account account;
  DnsStub dns;
  const UpstreamSettings upstream;
  host::UniqueFd stop;  // eventfd: readable once stopping
  std::vector<host::UniqueFd> listeners;

  mutable std::mutex mutex;
  std::condition_variable idle;
  std::size_t active = 0;

  ConnectionContext context(const Egress& egress) {
    return {egress, rules, names, account, dns, upstream, stop.get(), credentials.get()};
  }
};

EgressProxy::EgressProxy(std::vector<host::UniqueFd> listeners, const Egress& egress,
                         UpstreamSettings upstream, std::shared_ptr<const Credentials> credentials)
    : shared_(std::make_shared<Shared>(egress, std::move(upstream), std::move(credentials))) {
  shared_->stop = host::UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  host::UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!shared_->stop || !epoll)
    throw Error("egress: cannot make the proxy's event loop: " + sys::errno_text(errno));
  shared_->listeners = std::move(listeners);
  auto watch = [&](int fd) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &event) != 0)
      throw Error("egress: cannot watch a listener: " + sys::errno_text(errno));
  };
  watch(shared_->stop.get());
  for (const auto& listener : shared_->listeners) watch(listener.get());

  loop_ = std::thread([shared = shared_, epoll = std::move(epoll)] {
    std::array<std::uint8_t, 65536> datagram;
    std::array<epoll_event, 32> events;
    for (;;) {
      const int ready = epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()), -1);
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return;
      for (int i = 0; i < ready; ++i) {
        const int fd = events[static_cast<std::size_t>(i)].data.fd;
        if (fd == shared->stop.get()) return;
        if (is_datagram(fd)) {
          for (int n = 0; n < kDatagramsPerWake; ++n) {
            sockaddr_storage peer{};
            socklen_t length = sizeof peer;
            const ssize_t got = recvfrom(fd, datagram.data(), datagram.size(), MSG_DONTWAIT,
                                         reinterpret_cast<sockaddr*>(&peer), &length);
            if (got < 0) break;
            const auto answer =
                shared->dns.answer(std::span(datagram.data(), static_cast<std::size_t>(got)));
            if (!answer.empty())
              sendto(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                     reinterpret_cast<sockaddr*>(&peer), length);
          }
          continue;
        }
        host::UniqueFd client(accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!client) continue;
        {
          std::lock_guard lock(shared->mutex);
          if (shared->active >= shared->limits.connections) {
            shared->account.deny(Denial::limit, "", "", 0);
            continue;  // closed: the flood ends here, not in the host side
          }
          ++shared->active;
        }
        try {
          std::thread([shared, client = std::move(client)]() mutable {
            try {
              const auto egress = shared->rules.current();
              serve_connection(shared->context(*egress), std::move(client));
            } catch (const std::exception&) {
              // A connection that could not be served is closed; the sandbox sees a reset.
            }
            std::lock_guard lock(shared->mutex);
            --shared->active;
            shared->idle.notify_all();
          }).detach();
        } catch (const std::system_error&) {
          std::lock_guard lock(shared->mutex);
          --shared->active;  // no thread: the connection closes
        }
      }
    }
  });
}

EgressProxy::~EgressProxy() {
  stop();
}

void EgressProxy::stop() {
  if (!loop_.joinable()) return;
  const std::uint64_t one = 1;
  if (write(shared_->stop.get(), &one, sizeof one) != sizeof one) {
    // An eventfd's counter does not overflow at 1; nothing else can fail here.
  }
  loop_.join();
  std::unique_lock lock(shared_->mutex);
  shared_->idle.wait_for(lock, kStopWait, [&] { return shared_->active == 0; });
  shared_->listeners.clear();
}

NetworkAccount EgressProxy::account() const {
  return shared_->account.snapshot();
}

std::size_t EgressProxy::narrow(const Egress& narrower) {
  return shared_->rules.replace(narrower);
}

void EgressProxy::restart_clock() {
  shared_->account.restart_clock();
}

std::size_t EgressProxy::active_connections() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->active;
}

}  // namespace rlm::egress
