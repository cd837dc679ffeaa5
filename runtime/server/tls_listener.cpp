#include "server/tls_listener.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::server {

namespace {

std::string address_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(v4.sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(v6.sin6_port));
  }
  return "?";
}

}  // namespace

bool ServerTlsContext::FileVersion::operator==(const FileVersion& other) const {
  return device == other.device && inode == other.inode && size == other.size &&
         changed.tv_sec == other.changed.tv_sec && changed.tv_nsec == other.changed.tv_nsec;
}

ServerTlsContext::FileVersion ServerTlsContext::version_of(const std::string& path) {
  struct stat status {};
  if (stat(path.c_str(), &status) != 0) return {};
  return {status.st_dev, status.st_ino, status.st_size, status.st_ctim};
}

ServerTlsContext::ServerTlsContext(std::string cert, std::string key, std::string client_ca,
                                   std::string client_crl, Report report)
    : cert_(std::move(cert)),
      key_(std::move(key)),
      client_ca_(std::move(client_ca)),
      client_crl_(std::move(client_crl)),
      report_(std::move(report)),
      crl_version_(client_crl_.empty() ? FileVersion{} : version_of(client_crl_)),
      next_look_(Clock::now() + std::chrono::seconds(1)) {
  context_ = TlsContext::for_server(cert_, key_, client_ca_, client_crl_);
}

std::shared_ptr<TlsContext> ServerTlsContext::current() {
  std::lock_guard lock(mutex_);
  if (client_crl_.empty() || Clock::now() < next_look_) return context_;
  next_look_ = Clock::now() + std::chrono::seconds(1);
  const FileVersion now = version_of(client_crl_);
  if (now == crl_version_) return context_;
  crl_version_ = now;  // loaded or not, this version is not tried again
  try {
    context_ = TlsContext::for_server(cert_, key_, client_ca_, client_crl_);
    if (report_) report_(true, "");
  } catch (const Error& error) {  // not whole yet, or gone: the list in force stays
    if (report_) report_(false, error.what());
  }
  return context_;
}

TlsListener listen_tls(const std::string& host_port, const std::string& cert,
                       const std::string& key, const std::string& client_ca,
                       const std::string& client_crl, int backlog,
                       ServerTlsContext::Report report) {
  const auto where = split_host_port(host_port);
  HostPort bind_to;
  if (where) {
    bind_to = *where;
  } else {  // split_host_port refuses port 0; a test or a script asks for any free port with it
    const std::size_t colon = host_port.rfind(':');
    if (colon == std::string::npos || host_port.substr(colon + 1) != "0")
      throw Error("--listen " + host_port + ": expected HOST:PORT (e.g. 0.0.0.0:7443)");
    bind_to.host = host_port.substr(0, colon);
    if (bind_to.host.size() > 2 && bind_to.host.front() == '[' && bind_to.host.back() == ']')
      bind_to.host = bind_to.host.substr(1, bind_to.host.size() - 2);
    bind_to.port = "0";
  }
  TlsListener listener;
  listener.context =
      std::make_unique<ServerTlsContext>(cert, key, client_ca, client_crl, std::move(report));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int failed = getaddrinfo(bind_to.host.c_str(), bind_to.port.c_str(), &hints, &found))
    throw Error("--listen " + host_port + ": " + gai_strerror(failed));
  std::string why = "no address";
  for (addrinfo* entry = found; entry && !listener.fd; entry = entry->ai_next) {
    host::UniqueFd socket(::socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC, 0));
    if (!socket) continue;
    const int on = 1;
    setsockopt(socket.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(socket.get(), entry->ai_addr, entry->ai_addrlen) != 0 ||
        listen(socket.get(), backlog) != 0) {
      why = sys::errno_text(errno);
      continue;
    }
    listener.fd = std::move(socket);
  }
  freeaddrinfo(found);
  if (!listener.fd) throw Error("--listen " + host_port + ": cannot listen: " + why);
  sockaddr_storage bound{};
  socklen_t size = sizeof bound;
  getsockname(listener.fd.get(), reinterpret_cast<sockaddr*>(&bound), &size);
  listener.address = address_text(bound);
  return listener;
}

bool speaks_tls(int socket, Clock::time_point deadline) {
  for (;;) {
    unsigned char first = 0;
    const ssize_t got = recv(socket, &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 1) return first == 0x16;  // a TLS handshake record
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return false;
    pollfd entry{socket, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || poll(&entry, 1, static_cast<int>(left)) <= 0) return false;
  }
}

std::variant<Peer, std::string> peer_of_identities(const std::vector<std::string>& names,
                                                   const std::map<std::string, uid_t>& identities) {
  std::optional<std::pair<std::string, uid_t>> chosen;
  for (const auto& name : names) {
    const auto found = identities.find(name);
    if (found == identities.end()) continue;
    if (chosen && chosen->second != found->second)
      return "the client certificate names '" + chosen->first + "' (uid " +
             std::to_string(chosen->second) + ") and '" + name + "' (uid " +
             std::to_string(found->second) + "); an identity must map to one uid";
    if (!chosen) chosen.emplace(name, found->second);
  }
  if (!chosen) {
    std::string listed;
    for (std::size_t i = 0; i < names.size() && i < 8; ++i)
      listed += (i ? ", " : "") + ("'" + names[i] + "'");
    return "the client certificate's identity (" + (listed.empty() ? "none" : listed) +
           ") has no permits on this server: no --tls-identity names it";
  }
  Peer peer;
  peer.uid = chosen->second;
  peer.gid = chosen->second;
  passwd entry{};
  passwd* result = nullptr;
  char buffer[4096];
  if (getpwuid_r(peer.uid, &entry, buffer, sizeof buffer, &result) == 0 && result)
    peer.gid = result->pw_gid;
  peer.identity = chosen->first;
  return peer;
}

std::string remote_address(int socket) {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  if (getpeername(socket, reinterpret_cast<sockaddr*>(&address), &size) != 0) return "?";
  return address_text(address);
}

}  // namespace rlm::server
