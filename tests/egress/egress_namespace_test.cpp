// An egress allowlist on the namespace backend, attacked from inside real sandboxes with
// python3's own clients and hand-made bytes, against the fake internet of egress_world.hpp.
// Every rule of docs/network.md has a test here that sees it hold (and one that sees the way
// through it work, so a test cannot pass by everything being cut off).
#include <dirent.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "egress_world.hpp"
#include "namespace/namespace_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/pool.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/server_process.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Python run in the sandbox: helpers every test's code may use.
constexpr const char* kPrelude = R"PY(
import socket, ssl, struct, sys, time
def https_get(name, sni=None, port=443, timeout=10):
    context = ssl.create_default_context(cafile="/world/server.pem")
    if sni is None: sni = name
    if sni == "": context.check_hostname = False
    with socket.create_connection((name, port), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname=sni or None) as tls:
            tls.sendall(b"GET / HTTP/1.0\r\nHost: " + name.encode() + b"\r\n\r\n")
            data = b""
            while True:
                chunk = tls.recv(4096)
                if not chunk: break
                data += chunk
            return data.decode().split("\r\n\r\n", 1)[1]
def exchange(address, port, data, timeout=10):
    with socket.create_connection((address, port), timeout=timeout) as conn:
        try:  # a connection the host side refused may be reset before all is sent
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            return b""
        out = b""
        while True:
            try: chunk = conn.recv(65536)
            except ConnectionResetError: break
            if not chunk: break
            out += chunk
        return out
def dns_query(name, qtype=1, server="8.8.8.8"):
    packet = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        packet += bytes([len(label)]) + label.encode()
    packet += b"\0" + struct.pack("!HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(5)
        udp.sendto(packet, (server, 53))
        answer = udp.recv(4096)
    rcode = answer[3] & 0xf
    count = struct.unpack("!H", answer[6:8])[0]
    address = ".".join(str(b) for b in answer[-4:]) if count and qtype == 1 else None
    return rcode, count, address
def client_hello(sni, extra=b""):
    name = sni.encode("latin-1")
    ext = struct.pack("!HHHBH", 0, len(name) + 5, len(name) + 3, 0, len(name)) + name + extra
    body = b"\x03\x03" + b"\x11" * 32 + b"\0" + b"\0\x02\x13\x01" + b"\x01\0"
    body += struct.pack("!H", len(ext)) + ext
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake
def raw_dns(labels, qtype=1, server="8.8.8.8"):
    packet = struct.pack("!HHHHHH", 0x4321, 0x0100, 1, 0, 0, 0)
    for label in labels:
        packet += bytes([len(label)]) + label
    packet += b"\0" + struct.pack("!HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(5)
        udp.sendto(packet, (server, 53))
        answer = udp.recv(4096)
    return answer[3] & 0xf, struct.unpack("!H", answer[6:8])[0]
def outcome(fn, *args, **kwargs):
    try:
        return "ok:" + str(fn(*args, **kwargs))
    except Exception as error:
        return "error:" + type(error).__name__
)PY";

class EgressNamespace : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EgressWorld::possible())
      GTEST_SKIP() << "the test world needs root, to give the test process a network namespace "
                      "of its own (a rootless runtime cannot make one it could also serve from)";
    const auto why = world_.start();
    ASSERT_TRUE(why.empty()) << why;
  }

  Policy policy(const json& network) const {
    Policy policy = load_policy_text(json{{"extends", "default"}, {"network", network}}.dump(),
                                     "egress-test.json");
    policy.limits.wall_time = 60s;
    policy.limits.cpu_time = 60s;
    world_.bind_into(policy);
    return policy;
  }

  Result python(const std::string& code, const Policy& policy) const {
    Request request;
    request.argv = {"python3", "-c", std::string(kPrelude) + code};
    return ns::make_namespace_backend()->run(request, policy);
  }

  static const NetworkDenied* denial(const Result& result, const std::string& kind,
                                     const std::string& name = "*") {
    if (!result.network) return nullptr;
    for (const auto& entry : result.network->denied)
      if (entry.kind == kind && (name == "*" || entry.name == name)) return &entry;
    return nullptr;
  }

  EgressWorld world_;
};

std::string describe(const Result& result) {
  return result.to_json().dump(2);
}

// The lines of a payload's output.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// What outcome() printed for a connection that carried nothing back: closed by the host side
// (empty, or a reset or broken pipe on the way) or refused for want of a listener.
bool nothing_came_back(const std::string& line) {
  return line == "ok:b''" || line.rfind("error:", 0) == 0;
}

TEST_F(EgressNamespace, AnAllowedTlsFetchWorksAndIsAccountedWithItsBytes) {
  const auto result =
      python("print(https_get('pypi.test'))", policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "tls ok sni=pypi.test\n");
  ASSERT_TRUE(result.network) << describe(result);
  ASSERT_EQ(result.network->allowed.size(), 1u) << describe(result);
  const auto& entry = result.network->allowed[0];
  EXPECT_EQ(entry.name, "pypi.test");
  EXPECT_EQ(entry.address, EgressWorld::kTls);
  EXPECT_EQ(entry.port, 443);
  EXPECT_EQ(entry.rule, "pypi.test:443");
  EXPECT_GT(entry.bytes_out, 200u);  // a ClientHello and a request
  EXPECT_GT(entry.bytes_in, 200u);   // a certificate and an answer
  EXPECT_TRUE(result.network->denied.empty()) << describe(result);
}

TEST_F(EgressNamespace, ADeniedNameIsNxdomainAndNoQueryForItLeavesTheHost) {
  const auto result = python(R"PY(
print(outcome(socket.getaddrinfo, "evil.test", 443))
print(outcome(socket.getaddrinfo, "pypi.test.evil.test", 443))
infos = socket.getaddrinfo("pypi.test", 443, socket.AF_INET, socket.SOCK_STREAM)
print(infos[0][4][0].startswith("198.1"))
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "error:gaierror\nerror:gaierror\nTrue\n");
  EXPECT_TRUE(denial(result, "dns", "evil.test")) << describe(result);
  // Not even the allowed name: the host side asks only when a connection is made.
  EXPECT_FALSE(world_.queried("evil.test"));
  EXPECT_FALSE(world_.queried("pypi.test.evil.test"));
  EXPECT_FALSE(world_.queried("pypi.test"));
}

TEST_F(EgressNamespace, RawDnsToAnyAddressGetsTheSamePolicyAndOtherUdpIsRefused) {
  const auto result = python(R"PY(
print(dns_query("evil.test", 1, "8.8.8.8")[0])
rcode, count, address = dns_query("pypi.test", 1, "1.1.1.1")
print(rcode, count, address.startswith("198.1"))
print(dns_query("pypi.test", 28, "9.9.9.9")[:2])
print(dns_query("pypi.test", 16, "203.0.113.10")[:2])
print(dns_query("pypi.test", 65, "127.0.0.53")[:2])
def udp_443():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(5)
        udp.connect(("203.0.113.10", 443))
        udp.send(b"quic?")
        return udp.recv(100)
print(outcome(udp_443))
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data,
            "3\n0 1 True\n(0, 0)\n(0, 0)\n(0, 0)\nerror:ConnectionRefusedError\n")
      << describe(result);
  EXPECT_FALSE(world_.queried("evil.test"));
  EXPECT_FALSE(world_.queried("pypi.test"));
}

TEST_F(EgressNamespace, AForeignOrMissingSniIsDeniedAndReachesNoUpstream) {
  const auto result = python(R"PY(
print(outcome(https_get, "pypi.test", sni="other.test"))
print(outcome(https_get, "pypi.test", sni=""))
print(outcome(https_get, "pypi.test"))
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto lines = result.stdout_data;
  EXPECT_EQ(lines.substr(0, lines.find('\n')).rfind("error:", 0), 0u) << lines;
  EXPECT_NE(lines.find("\nok:tls ok sni=pypi.test\n"), std::string::npos) << lines;
  EXPECT_TRUE(denial(result, "sni_mismatch", "other.test")) << describe(result);
  EXPECT_TRUE(denial(result, "sni_mismatch", "")) << describe(result);
  ASSERT_TRUE(result.network);
  EXPECT_EQ(result.network->allowed.size(), 1u) << describe(result);
}

// Found by an attack: a label holding a NUL under an allowed wildcard matched it, and the host's
// resolver, reading up to the NUL, took "3405803788" for 203.0.113.12 (or asked for a name the
// policy never allowed). Only host names are looked at now.
TEST_F(EgressNamespace, ANameThatIsNotAHostNameIsNeverAnsweredNorAsked) {
  const auto result = python(R"PY(
print(raw_dns([b"3405803788\x00", b"cdn", b"test"]))
print(raw_dns([b"secret\x00", b"cdn", b"test"]))
print(raw_dns([b"a b", b"cdn", b"test"]))
print(raw_dns([b"\xff", b"cdn", b"test"]))
print(raw_dns([b"a", b"cdn", b"test"]))
)PY",
                             policy({{"allow", {"*.cdn.test:5432"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "(3, 0)\n(3, 0)\n(3, 0)\n(3, 0)\n(0, 1)\n") << describe(result);
  for (const auto& query : world_.queries()) ADD_FAILURE() << "the resolver was asked: " << query;
}

// Found by an attack: after a HelloRetryRequest a client sends a second ClientHello in the clear;
// the first one's check must hold for it too, or it could name another host on the same address.
TEST_F(EgressNamespace, ASecondClientHelloMustNameTheSameHost) {
  const auto result = python(R"PY(
ip = socket.gethostbyname("pypi.test")
print(exchange(ip, 443, client_hello("pypi.test") + client_hello("other.test")) != b"")
print(exchange(ip, 443, client_hello("pypi.test") + client_hello("pypi.test", struct.pack("!HH", 0xffce, 2) + b"\0\0")) != b"")
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_TRUE(denial(result, "sni_mismatch", "other.test")) << describe(result);
  EXPECT_TRUE(denial(result, "ech", "pypi.test")) << describe(result);
}

TEST_F(EgressNamespace, EchAndNonTlsBytesOnATlsPortAreDenied) {
  // A ClientHello by hand: SNI pypi.test plus an encrypted_client_hello extension.
  const auto result = python(R"PY(
def hello(with_ech):
    sni = b"pypi.test"
    ext = struct.pack("!HHHBH", 0, len(sni) + 5, len(sni) + 3, 0, len(sni)) + sni
    if with_ech: ext += struct.pack("!HH", 0xfe0d, 4) + b"\0\0\0\0"
    body = b"\x03\x03" + b"\x11" * 32 + b"\0" + b"\0\x02\x13\x01" + b"\x01\0"
    body += struct.pack("!H", len(ext)) + ext
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake
ip = socket.gethostbyname("pypi.test")
print(exchange(ip, 443, hello(True)))
print(exchange(ip, 443, b"GET / HTTP/1.1\r\nHost: pypi.test\r\n\r\n"))
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "b''\nb''\n");
  EXPECT_TRUE(denial(result, "ech", "pypi.test")) << describe(result);
  EXPECT_TRUE(denial(result, "not_tls", "pypi.test")) << describe(result);
  EXPECT_TRUE(result.network->allowed.empty()) << describe(result);
  EXPECT_TRUE(world_.requests().empty());
}

TEST_F(EgressNamespace, AnHttpEntryChecksTheHostOfOneRequestAConnection) {
  const auto result = python(R"PY(
ip = socket.gethostbyname("web.test")
print(exchange(ip, 80, b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n").split(b"\r\n\r\n")[1])
print(exchange(ip, 80, b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
print(exchange(ip, 80, b"CONNECT evil.test:443 HTTP/1.1\r\nHost: web.test\r\n\r\n"))
print(exchange(ip, 80, b"GET / HTTP/1.1\r\nHost: web.test:8080\r\n\r\n"))
print(exchange(ip, 80, b"GET / HTTP/1.1\r\nHost: web.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"))
kept = exchange(ip, 80, b"GET /1 HTTP/1.1\r\nHost: web.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n")
print(kept.count(b"http ok"))
with socket.create_connection((ip, 80), timeout=10) as conn:
    conn.sendall(b"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\n")
    first = conn.recv(4096)
    time.sleep(0.2)
    conn.sendall(b"GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    rest = b""
    try:
        while True:
            chunk = conn.recv(4096)
            if not chunk: break
            rest += chunk
    except ConnectionResetError:
        pass
    print(b"http ok" in first, rest.count(b"http ok"))
)PY",
                             policy({{"allow", {"http://web.test"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  // The pipelined pair is refused whole: the second request rode in the first one's bytes.
  EXPECT_EQ(result.stdout_data, "b'http ok Host=web.test'\nb''\nb''\nb''\nb''\n0\nTrue 0\n")
      << describe(result);
  EXPECT_TRUE(denial(result, "host_mismatch", "evil.test")) << describe(result);
  EXPECT_TRUE(denial(result, "protocol", "web.test")) << describe(result);
  for (const auto& request : world_.requests()) {
    EXPECT_EQ(request.find("evil.test"), std::string::npos) << request;
    EXPECT_NE(request.find("Connection: close"), std::string::npos) << request;
  }
}

TEST_F(EgressNamespace, IpLiteralsPassOnlyThroughCidrEntries) {
  const std::string code = R"PY(
print(outcome(exchange, "203.0.113.12", 5432, b"ping"))
print(outcome(exchange, "203.0.113.10", 443, b"ping"))
)PY";
  const auto named = python(code, policy({{"allow", {"pypi.test:443", "echo.test:5432"}}}));
  ASSERT_EQ(named.status, Status::ok) << describe(named);
  ASSERT_EQ(lines_of(named.stdout_data).size(), 2u) << describe(named);
  for (const auto& line : lines_of(named.stdout_data)) EXPECT_TRUE(nothing_came_back(line)) << line;
  EXPECT_TRUE(denial(named, "no_rule")) << describe(named);
  EXPECT_TRUE(named.network->allowed.empty()) << describe(named);

  const auto by_cidr = python(code, policy({{"allow", {"203.0.113.12/32:5432"}}}));
  ASSERT_EQ(by_cidr.status, Status::ok) << describe(by_cidr);
  const auto lines = lines_of(by_cidr.stdout_data);
  ASSERT_EQ(lines.size(), 2u) << describe(by_cidr);
  EXPECT_EQ(lines[0], "ok:b'ping'");
  EXPECT_TRUE(nothing_came_back(lines[1])) << lines[1];
  ASSERT_EQ(by_cidr.network->allowed.size(), 1u) << describe(by_cidr);
  EXPECT_EQ(by_cidr.network->allowed[0].bytes_out, 4u);
  EXPECT_EQ(by_cidr.network->allowed[0].bytes_in, 4u);
}

TEST_F(EgressNamespace, ANameResolvingToAPrivateAddressIsRefusedUnlessAllowed) {
  const std::string code = R"PY(
print(outcome(exchange, socket.gethostbyname("rebind.test"), 5432, b"x"))
print(outcome(exchange, socket.gethostbyname("meta.test"), 80, b"GET / HTTP/1.0\r\n\r\n"))
)PY";
  const auto result = python(code, policy({{"allow", {"rebind.test:5432", "meta.test:80"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  ASSERT_EQ(lines_of(result.stdout_data).size(), 2u) << describe(result);
  for (const auto& line : lines_of(result.stdout_data))
    EXPECT_TRUE(nothing_came_back(line)) << line;
  const auto* rebind = denial(result, "private_address", "rebind.test");
  ASSERT_TRUE(rebind) << describe(result);
  EXPECT_EQ(rebind->destination, "127.0.0.1");
  EXPECT_TRUE(denial(result, "private_address", "meta.test")) << describe(result);
  EXPECT_TRUE(result.network->allowed.empty()) << describe(result);

  const std::string echo = R"PY(
print(outcome(exchange, socket.gethostbyname("rebind.test"), 5432, b"x"))
)PY";
  const auto allowed = python(echo, policy({{"allow", {"rebind.test:5432"}}, {"private", true}}));
  EXPECT_EQ(allowed.stdout_data, "ok:b'x'\n") << describe(allowed);
  const auto by_cidr = python(echo, policy({{"allow", {"rebind.test:5432", "127.0.0.0/8:5432"}}}));
  EXPECT_EQ(by_cidr.stdout_data, "ok:b'x'\n") << describe(by_cidr);
}

TEST_F(EgressNamespace, Ipv6IsClosedLiteralsAndAaaaAlike) {
  const auto result = python(R"PY(
print(outcome(socket.getaddrinfo, "pypi.test", 443, socket.AF_INET6))
def v6(address):
    with socket.create_connection((address, 443), timeout=5) as conn:
        conn.sendall(b"x")
        return conn.recv(10)
print(outcome(v6, "2001:db8::10"))
print(outcome(v6, "::1"))
)PY",
                             policy({{"allow", {"pypi.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  // AAAA is empty; a literal reaches no upstream (closed at once, or no route where the kernel
  // has no IPv6).
  std::istringstream lines(result.stdout_data);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line, "error:gaierror");
  bool reached_the_host_side = false;
  while (std::getline(lines, line)) {
    EXPECT_TRUE(line == "ok:b''" || line.rfind("error:", 0) == 0) << line;
    reached_the_host_side = reached_the_host_side || line == "ok:b''";
  }
  if (reached_the_host_side) {
    EXPECT_TRUE(denial(result, "no_rule")) << describe(result);
  }
  ASSERT_TRUE(result.network);
  EXPECT_TRUE(result.network->allowed.empty()) << describe(result);
}

TEST_F(EgressNamespace, WildcardsMatchNamesBelowTheZoneOnly) {
  const auto result = python(R"PY(
for name in ["a.cdn.test", "b.a.cdn.test", "A.CDN.TEST.", "cdn.test", "cdn.test.evil.test",
             "xcdn.test", "a.cdn.test.evil.test"]:
    print(name, dns_query(name.rstrip(".") if name.endswith(".") else name)[0])
print(outcome(https_get, "a.cdn.test"))
print(socket.gethostbyname("B.A.Cdn.Test.").startswith("198.1"))
)PY",
                             policy({{"allow", {"*.cdn.test:443"}}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data,
            "a.cdn.test 0\nb.a.cdn.test 0\nA.CDN.TEST. 0\ncdn.test 3\ncdn.test.evil.test 3\n"
            "xcdn.test 3\na.cdn.test.evil.test 3\nok:tls ok sni=a.cdn.test\nTrue\n")
      << describe(result);
}

TEST_F(EgressNamespace, FiveThousandNamesAreCappedAndTheHostSideCarriesOn) {
  auto capped = policy({{"allow", {"*.cdn.test:443", "pypi.test:443"}}});
  const auto result = python(R"PY(
ip = socket.gethostbyname("pypi.test")
codes = {}
for i in range(5000):
    rcode = dns_query("n%d.cdn.test" % i)[0]
    codes[rcode] = codes.get(rcode, 0) + 1
print(sorted(codes.items()))
print(https_get("pypi.test"))
)PY",
                             capped);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  // 4,096 names in all (pypi.test is one): the rest are refused.
  EXPECT_EQ(result.stdout_data, "[(0, 4095), (5, 905)]\ntls ok sni=pypi.test\n")
      << describe(result);
  const auto* limit = denial(result, "limit");
  ASSERT_TRUE(limit) << describe(result);
  ASSERT_TRUE(result.network);
  EXPECT_LE(result.network->denied.size(), 256u);
  EXPECT_TRUE(result.network->truncated) << describe(result);
}

TEST_F(EgressNamespace, AFloodOfConnectionsAndASlowHelloEndThereNotInTheHostSide) {
  auto limited = policy({{"allow", {"pypi.test:443"}},
                         {"limits", {{"connections", 4}, {"client_hello_wait_ms", 1000}}}});
  const auto result = python(R"PY(
ip = socket.gethostbyname("pypi.test")
held = [socket.create_connection((ip, 443), timeout=5) for _ in range(4)]
time.sleep(0.3)
extra = socket.create_connection((ip, 443), timeout=5)
extra.sendall(b"\x16")
print(outcome(extra.recv, 10))
start = time.monotonic()
slow = held[0]
try:
    for _ in range(60):
        slow.sendall(b"\x16")
        time.sleep(0.2)
        if slow.recv(10, socket.MSG_DONTWAIT) == b"": break
except (BlockingIOError,):
    pass
except OSError:
    pass
print(time.monotonic() - start < 8)  # the hello wait is 1 s; unbounded would be 12 s
for conn in held: conn.close()
time.sleep(0.3)
print(https_get("pypi.test"))
)PY",
                             limited);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("True\ntls ok sni=pypi.test\n"), std::string::npos)
      << describe(result);
  EXPECT_TRUE(denial(result, "limit")) << describe(result);
}

std::size_t open_fds() {
  std::size_t count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir)) ++count;
    closedir(dir);
  }
  return count;
}

TEST_F(EgressNamespace, FiftySandboxesOfTwentyConnectionsLeaveNoFdBehind) {
  const auto allowed = policy({{"allow", {"echo.test:5432"}}});
  const std::string code = R"PY(
ip = socket.gethostbyname("echo.test")
print(sum(exchange(ip, 5432, b"x" * 100) == b"x" * 100 for _ in range(20)))
)PY";
  (void)python(code, allowed);  // the first run's one-off allocations
  const auto before = open_fds();
  for (int i = 0; i < 50; ++i) {
    const auto result = python(code, allowed);
    ASSERT_EQ(result.stdout_data, "20\n") << describe(result);
  }
  EXPECT_EQ(open_fds(), before);
}

// A REPL session's sandbox is a run like any other: the allowlist holds in its cells, and each
// cell's result carries what that cell did on the network, no more.
TEST_F(EgressNamespace, ASessionsCellsEachCarryTheirOwnSliceOfTheAccount) {
  Policy repl = load_policy_text(
      json{{"extends", "python-repl"}, {"network", {{"allow", {"pypi.test:443"}}}}}.dump(),
      "egress-repl.json");
  world_.bind_into(repl);
  auto session = ns::make_namespace_backend()->open_session(repl, {});
  const auto setup = session->execute(std::string(kPrelude), std::chrono::seconds(30));
  ASSERT_EQ(setup.status, CellStatus::ok) << setup.error;
  const auto denied = session->execute("print(outcome(socket.gethostbyname, 'evil.test'))",
                                       std::chrono::seconds(30));
  ASSERT_EQ(denied.status, CellStatus::ok) << denied.error;
  EXPECT_EQ(denied.stdout_data, "error:gaierror\n");
  ASSERT_TRUE(denied.network) << denied.to_json().dump();
  EXPECT_TRUE(denied.network->allowed.empty()) << denied.to_json().dump();
  ASSERT_EQ(denied.network->denied.size(), 1u) << denied.to_json().dump();
  EXPECT_EQ(denied.network->denied[0].kind, "dns");
  EXPECT_EQ(denied.network->denied[0].name, "evil.test");

  const auto fetched = session->execute("print(https_get('pypi.test'))", std::chrono::seconds(30));
  ASSERT_EQ(fetched.status, CellStatus::ok) << fetched.error;
  EXPECT_EQ(fetched.stdout_data, "tls ok sni=pypi.test\n");
  ASSERT_TRUE(fetched.network) << fetched.to_json().dump();
  ASSERT_EQ(fetched.network->allowed.size(), 1u) << fetched.to_json().dump();
  EXPECT_EQ(fetched.network->allowed[0].name, "pypi.test");
  EXPECT_TRUE(fetched.network->denied.empty()) << fetched.to_json().dump();
  // What the cell printed over JSON reads back the same (the server relays cells so).
  const auto relayed = cell_result_from_json(fetched.to_json());
  ASSERT_TRUE(relayed.network);
  EXPECT_EQ(relayed.network->allowed.size(), 1u);
  session->close();
}

// A live session's allowlist narrows while it runs, directly and through the server: from the
// narrowing on, the dropped name is NXDOMAIN, a connection to the address its DNS bound before is
// denied, and a connection opened before and still open is ended at once; what stays allowed
// still works. Each narrowing is checked against the list as it is then, so none can widen it
// (not even back to what it was), a malformed entry is refused by its path, and a session with
// no allowlist has nothing to narrow.
class EgressSessionNarrowing : public EgressNamespace,
                               public ::testing::WithParamInterface<bool /*through a server*/> {};

constexpr const char* kNarrowingCells[] = {
    // 1: a connection to echo.test kept open, and the address echo.test's DNS bound.
    R"PY(
kept = socket.create_connection(("echo.test", 5432), timeout=10)
kept.sendall(b"one")
print(kept.recv(16), https_get("pypi.test"))
bound = socket.gethostbyname("echo.test")
)PY",
    // 2: after the narrowing to pypi.test alone.
    R"PY(
def kept_now():
    try:
        kept.settimeout(10)
        kept.sendall(b"two")
        return kept.recv(16) or b"ended"
    except OSError as error:
        return "ended:" + type(error).__name__
print(kept_now())
print(outcome(socket.gethostbyname, "echo.test"))
print(exchange(bound, 5432, b"again"))
print(https_get("pypi.test"))
)PY",
    // 3: after the narrowing to nothing.
    R"PY(
print(outcome(socket.gethostbyname, "pypi.test"))
)PY"};

TEST_P(EgressSessionNarrowing, ALiveSessionsAllowlistNarrowsAndEndsWhatItNoLongerLetsThrough) {
  const bool through_server = GetParam();
  Policy repl = load_policy_text(json{{"extends", "python-repl"},
                                      {"network", {{"allow", {"pypi.test:443", "echo.test:5432"}}}},
                                      {"limits", {{"wall_time_ms", "60s"}, {"cpu_time_ms", "60s"}}}}
                                     .dump(),
                                 "egress-repl.json");
  world_.bind_into(repl);
  std::optional<ServerProcess> server;
  std::unique_ptr<Session> session;
  if (through_server) {
    const std::string offered = world_.dir().file("offered-repl.json");
    std::ofstream(offered) << repl.to_json().dump();
    server.emplace(std::vector<std::string>{"--session-pool", offered + "=1"});
    session = ServerConnection(server->socket()).open_session(offered, nullptr, {});
  } else {
    session = ns::make_namespace_backend()->open_session(repl, {});
  }
  auto cell = [&](const std::string& code) {
    const auto result = session->execute(code, std::chrono::seconds(40));
    EXPECT_EQ(result.status, CellStatus::ok) << result.error << result.stderr_data;
    return result;
  };
  cell(kPrelude);
  EXPECT_EQ(cell(kNarrowingCells[0]).stdout_data, "b'one' tls ok sni=pypi.test\n");

  session->narrow_network({"pypi.test:443"});
  const auto after = cell(kNarrowingCells[1]);
  std::istringstream lines(after.stdout_data);
  std::string kept, lookup, again, fetch;
  std::getline(lines, kept);
  std::getline(lines, lookup);
  std::getline(lines, again);
  std::getline(lines, fetch);
  EXPECT_TRUE(kept == "b'ended'" || kept.starts_with("ended:")) << after.stdout_data;
  EXPECT_EQ(lookup, "error:gaierror") << after.stdout_data;
  EXPECT_EQ(again, "b''") << after.stdout_data;
  EXPECT_EQ(fetch, "tls ok sni=pypi.test") << after.stdout_data;
  ASSERT_TRUE(after.network) << after.to_json().dump();
  bool dns_denied = false, connection_denied = false;
  for (const auto& entry : after.network->denied) {
    dns_denied |= entry.kind == "dns" && entry.name == "echo.test";
    connection_denied |= entry.kind == "no_rule" && entry.name == "echo.test";
  }
  EXPECT_TRUE(dns_denied) << after.to_json().dump();
  EXPECT_TRUE(connection_denied) << after.to_json().dump();

  // Never wider than the list is now: echo.test is gone for good, evil.test never was.
  EXPECT_THROW(session->narrow_network({"echo.test:5432"}), Error);
  EXPECT_THROW(session->narrow_network({"pypi.test:443", "evil.test:443"}), Error);
  EXPECT_THROW(session->narrow_network({"pypi.test"}), Error);  // no port: malformed
  EXPECT_EQ(cell("print(https_get('pypi.test'))").stdout_data, "tls ok sni=pypi.test\n");

  session->narrow_network({});
  EXPECT_EQ(cell(kNarrowingCells[2]).stdout_data, "error:gaierror\n");
  session->close();
  EXPECT_THROW(session->narrow_network({}), Error);
}

TEST_P(EgressSessionNarrowing, ASessionWithoutAnAllowlistHasNothingToNarrow) {
  const bool through_server = GetParam();
  Policy repl = load_policy_text(json{{"extends", "python-repl"}}.dump(), "repl.json");
  std::optional<ServerProcess> server;
  std::unique_ptr<Session> session;
  if (through_server) {
    server.emplace(std::vector<std::string>{"--session-pool", "python-repl=1"});
    session = ServerConnection(server->socket()).open_session("python-repl", nullptr, {});
  } else {
    session = ns::make_namespace_backend()->open_session(repl, {});
  }
  try {
    session->narrow_network({"pypi.test:443"});
    ADD_FAILURE() << "a session with no network narrowed to an allowlist";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no egress allowlist"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(session->execute("print(1)").stdout_data, "1\n") << "the session goes on";
  session->close();
}

INSTANTIATE_TEST_SUITE_P(Paths, EgressSessionNarrowing, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Server" : "Direct"; });

// Through `rlm-sandbox serve` (started in this world, so it serves from its network namespace):
// a client's run of an offered allowlist is enforced and accounted the same, and a client may
// narrow the list but not widen it.
TEST_F(EgressNamespace, ThroughTheServerTheAllowlistHoldsAndOnlyNarrows) {
  world_.dir();  // the world's directory holds the offered policy
  const std::string offered = world_.dir().file("offered.json");
  {
    std::ofstream file(offered);
    file << json{{"extends", "default"},
                 {"network", {{"allow", {"pypi.test:443", "echo.test:5432"}}}},
                 {"limits", {{"wall_time_ms", "60s"}, {"cpu_time_ms", "60s"}}}}
                .dump();
  }
  ServerProcess server({"--pool", offered + "=1"});
  Request request;
  request.argv = {"python3", "-c", std::string(kPrelude) + R"PY(
print(exchange(socket.gethostbyname("echo.test"), 5432, b"ping"))
print(outcome(socket.gethostbyname, "evil.test"))
)PY"};
  const auto result = ServerConnection(server.socket()).run(request, offered);
  ASSERT_EQ(result.status, Status::ok) << describe(result) << server.log();
  EXPECT_EQ(result.stdout_data, "b'ping'\nerror:gaierror\n");
  ASSERT_TRUE(result.network) << describe(result);
  ASSERT_EQ(result.network->allowed.size(), 1u) << describe(result);
  EXPECT_TRUE(denial(result, "dns", "evil.test")) << describe(result);

  // Narrowed to echo.test only: pypi.test is no longer answered.
  ASSERT_EQ(ServerConnection(server.socket()).policy(offered).egress.allow.front().name,
            "pypi.test");
  Policy narrowed = ServerConnection(server.socket()).policy(offered);
  narrowed.egress.allow.erase(narrowed.egress.allow.begin());
  request.argv = {"python3", "-c",
                  std::string(kPrelude) + "print(outcome(socket.gethostbyname, 'pypi.test'))"};
  const auto narrow = ServerConnection(server.socket()).run(request, offered, &narrowed);
  EXPECT_EQ(narrow.stdout_data, "error:gaierror\n") << describe(narrow);

  Policy widened = ServerConnection(server.socket()).policy(offered);
  widened.egress.allow.push_back(widened.egress.allow.front());
  widened.egress.allow.back().name = "evil.test";
  widened.egress.allow.back().text = "evil.test:443";
  EXPECT_THROW(ServerConnection(server.socket()).run(request, offered, &widened), ServerRefused);
}

// A pool's warm sandboxes are built with the allowlist's listeners and host side in place, and
// each run on one is held and accounted the same; a narrower list is another shape, served cold.
TEST_F(EgressNamespace, APoolsWarmSandboxesEnforceTheAllowlistToo) {
  const auto allowed = policy({{"allow", {"pypi.test:443", "echo.test:5432"}}});
  Pool pool(allowed, PoolOptions{});
  Request request;
  request.argv = {"python3", "-c", std::string(kPrelude) + R"PY(
print(https_get("pypi.test"))
print(outcome(socket.gethostbyname, "evil.test"))
)PY"};
  for (int run = 0; run < 3; ++run) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (pool.stats().ready_sandboxes == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto result = pool.run(request);
    ASSERT_EQ(result.status, Status::ok) << describe(result);
    EXPECT_EQ(result.stdout_data, "tls ok sni=pypi.test\nerror:gaierror\n");
    ASSERT_TRUE(result.network) << describe(result);
    ASSERT_EQ(result.network->allowed.size(), 1u) << describe(result);
    EXPECT_LT(result.network->allowed[0].at, result.wall + std::chrono::seconds(1))
        << "times count from the run, not the build";
    EXPECT_TRUE(denial(result, "dns", "evil.test")) << describe(result);
  }
  EXPECT_GE(pool.stats().warm_runs, 1u) << "no run was served warm";

  auto narrowed = allowed;
  narrowed.egress.allow.erase(narrowed.egress.allow.begin());
  const auto narrow = pool.run(request, narrowed);
  EXPECT_NE(narrow.stderr_data.find("gaierror"), std::string::npos) << describe(narrow);
  EXPECT_TRUE(denial(narrow, "dns", "pypi.test")) << describe(narrow);
}

TEST_F(EgressNamespace, AnEmptyAllowlistIsNoNetwork) {
  const auto result = python("print(outcome(socket.getaddrinfo, 'pypi.test', 443))",
                             policy({{"allow", json::array()}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "error:gaierror\n");
  EXPECT_FALSE(result.network);
}

}  // namespace
}  // namespace rlm::test
