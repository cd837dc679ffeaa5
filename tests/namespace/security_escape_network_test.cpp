// Escape attempts through the network from inside the default sandbox on the namespace backend:
// the host's listeners on every address, its abstract unix sockets, and vsock (which no network
// namespace isolates). Each is tried for real from inside, never checked in the configuration.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

// ---- Network namespace --------------------------------------------------------------------------

// A listening TCP socket on the host, closed on destruction.
class HostListener {
 public:
  HostListener(int family, const std::string& address) {
    fd_ = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) return;
    sockaddr_storage storage{};
    socklen_t length = 0;
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&storage);
      in->sin_family = AF_INET;
      ::inet_pton(AF_INET, address.c_str(), &in->sin_addr);
      length = sizeof *in;
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
      in6->sin6_family = AF_INET6;
      ::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr);
      length = sizeof *in6;
    }
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&storage), length) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&storage)->sin_port
                                    : reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port);
  }
  ~HostListener() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostListener(const HostListener&) = delete;
  HostListener& operator=(const HostListener&) = delete;

  bool ok() const { return fd_ >= 0; }
  int port() const { return port_; }
  // A connection that reached this listener, accepted and closed; false when none is pending
  // (the listening socket is nonblocking: accept never waits).
  bool take_pending_connection() const {
    int connection = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (connection < 0) return false;
    ::close(connection);
    return true;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// True when this host process can connect to address:port (proves the listener is live).
bool host_can_connect(int family, const std::string& address, int port) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage storage{};
  socklen_t length;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address.c_str(), &in->sin_addr);
    length = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr);
    length = sizeof *in6;
  }
  bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) == 0;
  ::close(fd);
  return connected;
}

// The host's non-loopback IPv4 addresses.
std::vector<std::string> host_ipv4_addresses() {
  std::vector<std::string> addresses;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return addresses;
  for (ifaddrs* entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (entry->ifa_flags & IFF_LOOPBACK) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
                sizeof text);
    addresses.push_back(text);
  }
  ::freeifaddrs(list);
  return addresses;
}

TEST_F(NamespaceTest, HostListenersAreUnreachableWhileLoopbackInsideWorks) {
  HostListener loopback(AF_INET, "127.0.0.1");
  HostListener any(AF_INET, "0.0.0.0");
  HostListener loopback6(AF_INET6, "::1");  // optional: hosts without IPv6 skip it
  ASSERT_TRUE(loopback.ok() && any.ok());

  struct Target {
    int family;
    std::string address;
    const HostListener* listener;
  };
  std::vector<Target> targets{{AF_INET, "127.0.0.1", &loopback}, {AF_INET, "127.0.0.1", &any}};
  for (const auto& address : host_ipv4_addresses()) targets.push_back({AF_INET, address, &any});
  if (loopback6.ok()) targets.push_back({AF_INET6, "::1", &loopback6});

  // Each listener really accepts connections from the host, so "unreachable" below means the
  // sandbox, not a dead listener.
  for (const auto& target : targets) {
    ASSERT_TRUE(host_can_connect(target.family, target.address, target.listener->port()))
        << target.address << ":" << target.listener->port();
    ASSERT_TRUE(target.listener->take_pending_connection());
  }

  std::string list;
  for (const auto& target : targets)
    list += "(" + std::to_string(target.family == AF_INET ? 2 : 10) + ", '" + target.address +
            "', " + std::to_string(target.listener->port()) + "), ";
  auto result = python(R"PY(
import socket
targets = [)PY" + list +
                       R"PY(]
for i, (family, host, port) in enumerate(targets):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        outcome = 'CONNECTED'
    except OSError as e:
        outcome = type(e).__name__
    finally:
        s.close()
    print('target%d %s:%d %s' % (i, host, port, outcome))
try:
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=3)
    accepted, _ = server.accept()
    client.sendall(b'ping')
    print('loopback', accepted.recv(4).decode())
except OSError as e:
    print('loopback', type(e).__name__, e)
print('interfaces', ','.join(sorted(name for _, name in socket.if_nameindex())))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  for (size_t i = 0; i < targets.size(); ++i) {
    auto line = v["target" + std::to_string(i)];
    EXPECT_FALSE(line.empty()) << result.stdout_data;
    EXPECT_EQ(line.find("CONNECTED"), std::string::npos)
        << "the sandbox reached a host listener: " << line;
  }
  for (const auto* listener : {&loopback, &any, &loopback6}) {
    if (listener->ok()) {
      EXPECT_FALSE(listener->take_pending_connection())
          << "a connection from the sandbox arrived at host port " << listener->port();
    }
  }
  EXPECT_EQ(v["loopback"], "ping") << "loopback inside the sandbox does not work";
  EXPECT_EQ(v["interfaces"], "lo") << "the sandbox has network interfaces besides lo";
}

TEST_F(NamespaceTest, HostAbstractUnixSocketIsUnreachable) {
  // Abstract unix sockets belong to the network namespace: a host daemon listening on one (as
  // many do) must not be reachable from inside.
  const std::string name = "rlm-sec-" + random_token();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(fd, 4), 0);

  auto result = python(R"PY(
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect('\0)PY" + name +
                       R"PY(')
    print('abstract CONNECTED')
except OSError as e:
    print('abstract', type(e).__name__)
)PY");
  int pending = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (pending >= 0) ::close(pending);
  ::close(fd);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(parse_lines(result.stdout_data)["abstract"], "ConnectionRefusedError")
      << result.stdout_data;
  EXPECT_LT(pending, 0) << "a connection from the sandbox reached the host's abstract socket";
}

// ---- Socket families ----------------------------------------------------------------------------

TEST_F(NamespaceTest, VsockCannotBindOrListenUnderNetworkNone) {
  // Control: this host has a vsock transport (a network namespace does not isolate vsock, so a
  // listener inside would sit in the machine's real vsock port space).
  const int host = ::socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (host < 0)
    GTEST_SKIP() << "no AF_VSOCK on this host (" << std::strerror(errno)
                 << "); nothing for a sandbox to reach";
  ::close(host);
  ASSERT_EQ(policy_.network, Network::none);
  const std::string port =
      std::to_string(20000 + std::stoul(random_token().substr(0, 4), nullptr, 16) % 30000);
  auto result = python(R"PY(
import errno, socket
def outcome(make):
    try:
        s = make()
        return 'CREATED'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def listen():
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, )PY" +
                       port + R"PY())
    s.listen(1)
    print('vsock_port', s.getsockname()[1], flush=True)
    return s
print('vsock_listen', outcome(listen))
print('vsock_dgram', outcome(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_DGRAM)))
print('vsock_pair', outcome(lambda: socket.socketpair(socket.AF_VSOCK, socket.SOCK_STREAM)))
for name, kind in [('AF_PACKET', socket.SOCK_RAW), ('AF_ALG', socket.SOCK_SEQPACKET),
                   ('AF_CAN', socket.SOCK_RAW), ('AF_TIPC', socket.SOCK_RDM),
                   ('AF_RDS', socket.SOCK_SEQPACKET), ('AF_BLUETOOTH', socket.SOCK_STREAM)]:
    print('family_' + name, outcome(lambda: socket.socket(getattr(socket, name), kind)))
print('family_AF_UNIX', outcome(lambda: socket.socketpair(socket.AF_UNIX)))
print('family_AF_INET', outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)))
print('family_AF_NETLINK', outcome(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["vsock_listen"], "EAFNOSUPPORT")
      << "a sandbox under network: none listened on vsock port " << v["vsock_port"];
  EXPECT_EQ(v["vsock_dgram"], "EAFNOSUPPORT");
  EXPECT_EQ(v["vsock_pair"], "EAFNOSUPPORT");
  for (const char* family : {"AF_PACKET", "AF_ALG", "AF_CAN", "AF_TIPC", "AF_RDS", "AF_BLUETOOTH"})
    EXPECT_EQ(v[std::string("family_") + family], "EAFNOSUPPORT") << family;
  for (const char* family : {"AF_UNIX", "AF_INET", "AF_NETLINK"})
    EXPECT_EQ(v[std::string("family_") + family], "CREATED") << family;
}

}  // namespace
}  // namespace rlm::sectest
