// The egress suite's world and fixtures (egress_suite.cpp runs every rule of docs/network.md on
// each backend that enforces an allowlist; egress_namespace_test.cpp the namespace backend's own
// paths): python3's own clients and hand-made bytes, run in real sandboxes against the fake
// internet of egress_world.hpp.
#pragma once

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "egress_world.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "support/server_process.hpp"

namespace rlm::test {

// Python run in the sandbox: helpers every test's code may use.
inline constexpr const char* kPrelude = R"PY(
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

// Why `backend` cannot run the suite here, "" when it can: each test binary says for its own
// (egress_namespace_test.cpp, egress_docker_test.cpp).
std::string egress_backend_unavailable(const std::string& backend);

// A fake internet in this test process's own network namespace, and runs on `backend_`.
class EgressFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EgressWorld::possible())
      GTEST_SKIP() << "the test world needs root, to give the test process a network namespace "
                      "of its own (a rootless runtime cannot make one it could also serve from)";
    const auto why = world_.start();
    ASSERT_TRUE(why.empty()) << why;
  }

  Policy policy(const nlohmann::json& network) const {
    Policy policy = load_policy_text(
        nlohmann::json{{"extends", "default"}, {"network", network}}.dump(), "egress-test.json");
    policy.limits.wall_time = std::chrono::seconds(60);
    policy.limits.cpu_time = std::chrono::seconds(60);
    // The docker backend's test image (tools/docker-env): busybox, the host's /usr bound in.
    if (backend_ == "docker") policy.docker.image = "rlm-sandbox-test:busybox";
    world_.bind_into(policy);
    return policy;
  }

  // `code` after kPrelude, run under `policy` on backend_; "server" is the namespace backend
  // through an `rlm-sandbox serve` (server()), which gets `policy` as a client's narrowing of
  // wide_policy() -- or, for a policy that injects credentials (a client cannot add one), offers
  // it as it is.
  Result python(const std::string& code, const Policy& policy) const {
    Request request;
    request.argv = {"python3", "-c", std::string(kPrelude) + code};
    if (backend_ == "server") {
      const auto client = make_server_client(
          server(policy.egress.inject.empty() ? wide_policy() : policy).socket());
      Policy narrowing = policy;
      narrowing.name = offered_;
      auto result = client->run(request, narrowing);
      EXPECT_EQ(result.backend, "namespace");
      return result;
    }
    auto result = make_backend(backend_)->run(request, policy);
    EXPECT_EQ(result.backend, backend_);
    return result;
  }

  // Wider than every test's policy: the world's names on the ports the tests use, the CIDR
  // entries, private addresses.
  Policy wide_policy() const {
    return policy({{"allow",
                    {"pypi.test:443", "*.cdn.test:443", "*.cdn.test:5432", "http://web.test",
                     "echo.test:5432", "sink.test:9000", "rebind.test:5432", "meta.test:80",
                     "203.0.113.0/24:5432", "127.0.0.0/8:5432"}},
                   {"private", true}});
  }

  // The server of backend_ "server", offering `offered`: started from this process (so in the
  // world's network namespace, with its resolver and this environment) at its first use, and
  // again whenever another policy is to be offered.
  const ServerProcess& server(const Policy& offered) const {
    const std::string text = offered.to_json().dump();
    if (!server_ || text != offered_text_) {
      server_.reset();
      offered_ = world_.dir().file("offered-" + std::to_string(++offers_) + ".json");
      std::ofstream(offered_) << text;
      offered_text_ = text;
      server_ =
          std::make_unique<ServerProcess>(std::vector<std::string>{"--pool", offered_ + "=1"});
    }
    return *server_;
  }

  static const NetworkDenied* denial(const Result& result, const std::string& kind,
                                     const std::string& name = "*") {
    if (!result.network) return nullptr;
    for (const auto& entry : result.network->denied)
      if (entry.kind == kind && (name == "*" || entry.name == name)) return &entry;
    return nullptr;
  }

  EgressWorld world_;
  std::string backend_ = "namespace";
  mutable std::string offered_, offered_text_;
  mutable int offers_ = 0;
  mutable std::unique_ptr<ServerProcess> server_;
};

// The namespace backend's own paths (sessions, pools, the server).
class EgressNamespace : public EgressFixture {};

// Every rule, on each backend that enforces an allowlist (the parameter: its name).
class EgressSuite : public EgressFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam();
    if (const auto why = egress_backend_unavailable(backend_); !why.empty()) GTEST_SKIP() << why;
    EgressFixture::SetUp();
  }
};

inline std::string describe(const Result& result) {
  return result.to_json().dump(2);
}

// The lines of a payload's output.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// What outcome() printed for a connection that carried nothing back: closed by the host side
// (empty, or a reset or broken pipe on the way) or refused for want of a listener.
inline bool nothing_came_back(const std::string& line) {
  return line == "ok:b''" || line.rfind("error:", 0) == 0;
}

}  // namespace rlm::test
