// rlm-egress-bench: what an egress allowlist's host side costs a connection, beside the same
// connection made from the host's network namespace with no sandbox, measured by one python3
// client script run both ways, interleaved round by round:
//   connect    TCP connect + one byte out + one byte back, then close: per connection, through an
//              allowed name (the sandbox's DNS lookup, the host side's resolve, check, dial and
//              relay) against a direct connection to the upstream's address. Target: median at
//              most +1 ms.
//   bulk       one connection carrying --bulk-mb MiB to a sink: throughput through the relay
//              against direct loopback. Target: at least 80%.
// The world is the bench's own: it moves into a network namespace of its own (root only), puts
// the upstream's address on loopback, and serves an echo, a sink and a one-name resolver from
// threads of this process; nothing touches the host's network.
//
//   rlm-egress-bench [--rounds=N] [--connections=N] [--bulk-mb=N]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace {

constexpr const char* kUpstream = "203.0.113.20";
constexpr int kEchoPort = 7007, kSinkPort = 9009, kResolverPort = 5399;

long g_rounds = 10, g_connections = 50, g_bulk_mb = 512;

// The client, run on the host and in the sandbox alike: prints one number per line.
constexpr const char* kClient = R"PY(
import socket, sys, time
host, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "connect":
    for _ in range(count):
        start = time.perf_counter()
        with socket.create_connection((host, %ECHO%)) as conn:
            conn.sendall(b"x")
            conn.recv(1)
            print((time.perf_counter() - start) * 1000)
else:
    block = bytearray(1 << 20)
    start = time.perf_counter()
    with socket.create_connection((host, %SINK%)) as conn:
        for _ in range(count):
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(64)
    print(count / (time.perf_counter() - start) / 1024)  # GiB/s
)PY";

std::string client_script() {
  std::string script = kClient;
  script.replace(script.find("%ECHO%"), 6, std::to_string(kEchoPort));
  script.replace(script.find("%SINK%"), 6, std::to_string(kSinkPort));
  return script;
}

int listen_on(int type, const char* address, int port) {
  const int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, address, &where.sin_addr);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0 ||
      (type == SOCK_STREAM && listen(fd, 512) != 0)) {
    std::perror("rlm-egress-bench: bind");
    std::exit(1);
  }
  return fd;
}

void serve_forever(int listener, void (*handle)(int)) {
  std::thread([listener, handle] {
    for (;;) {
      const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      std::thread([conn, handle] {
        handle(conn);
        close(conn);
      }).detach();
    }
  }).detach();
}

void echo(int conn) {
  char buffer[4096];
  for (ssize_t got; (got = recv(conn, buffer, sizeof buffer, 0)) > 0;)
    if (send(conn, buffer, static_cast<std::size_t>(got), MSG_NOSIGNAL) != got) return;
}

void sink(int conn) {
  std::vector<char> buffer(1 << 20);
  unsigned long long total = 0;
  for (ssize_t got; (got = recv(conn, buffer.data(), buffer.size(), 0)) > 0;) total += got;
  const auto text = std::to_string(total);
  send(conn, text.data(), text.size(), MSG_NOSIGNAL);
}

// Answers every A query with the upstream's address, anything else with no records.
void resolver(int fd) {
  std::thread([fd] {
    unsigned char message[512];
    for (;;) {
      sockaddr_storage peer{};
      socklen_t length = sizeof peer;
      const ssize_t got =
          recvfrom(fd, message, sizeof message, 0, reinterpret_cast<sockaddr*>(&peer), &length);
      if (got < 17) continue;
      std::size_t end = 12;
      while (end < static_cast<std::size_t>(got) && message[end] != 0) end += message[end] + 1;
      end += 5;  // the root label, type, class
      if (end > static_cast<std::size_t>(got)) continue;
      const bool a = message[end - 4] == 0 && message[end - 3] == 1;
      std::vector<unsigned char> answer(message, message + end);
      answer[2] = 0x81;
      answer[3] = 0x80;
      answer[6] = 0;
      answer[7] = a ? 1 : 0;
      answer[8] = answer[9] = answer[10] = answer[11] = 0;
      if (a) {
        const unsigned char record[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4};
        answer.insert(answer.end(), record, record + sizeof record);
        in_addr address{};
        inet_pton(AF_INET, kUpstream, &address);
        const auto* bytes = reinterpret_cast<const unsigned char*>(&address);
        answer.insert(answer.end(), bytes, bytes + 4);
      }
      sendto(fd, answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&peer), length);
    }
  }).detach();
}

bool shell(const std::string& command) {
  return std::system(command.c_str()) == 0;
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> values;
  std::istringstream in(text);
  for (double value; in >> value;) values.push_back(value);
  return values;
}

std::vector<double> run_direct(const std::string& mode, long count) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    const std::string script = client_script(), host = kUpstream, n = std::to_string(count);
    execl("/usr/bin/python3", "python3", "-c", script.c_str(), host.c_str(), mode.c_str(),
          n.c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = read(out[0], buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<std::size_t>(got));
  close(out[0]);
  waitpid(pid, nullptr, 0);
  return numbers(text);
}

std::vector<double> run_sandboxed(rlm::Backend& backend, const rlm::Policy& policy,
                                  const std::string& mode, long count) {
  rlm::Request request;
  request.argv = {"/usr/bin/python3", "-c", client_script(),
                  "bench.test",       mode, std::to_string(count)};
  const auto result = backend.run(request, policy);
  if (result.status != rlm::Status::ok) {
    std::fprintf(stderr, "rlm-egress-bench: the sandboxed client failed: %s\n%s\n",
                 result.to_json().dump().c_str(), result.stderr_data.c_str());
    std::exit(1);
  }
  return numbers(result.stdout_data);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

long flag(int argc, char** argv, const char* name, long fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with(prefix)) return std::atol(argv[i] + prefix.size());
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  g_rounds = flag(argc, argv, "rounds", g_rounds);
  g_connections = flag(argc, argv, "connections", g_connections);
  g_bulk_mb = flag(argc, argv, "bulk-mb", g_bulk_mb);
  if (geteuid() != 0) {
    std::printf(
        "rlm-egress-bench: skipped: it needs root, to make the network namespace its "
        "world lives in\n");
    return 0;
  }
  if (unshare(CLONE_NEWNET) != 0) {
    std::perror("rlm-egress-bench: unshare(CLONE_NEWNET)");
    return 1;
  }
  if (!shell("ip link set lo up && ip addr add " + std::string(kUpstream) + "/32 dev lo")) {
    std::fprintf(stderr, "rlm-egress-bench: cannot set up loopback\n");
    return 1;
  }
  serve_forever(listen_on(SOCK_STREAM, kUpstream, kEchoPort), echo);
  serve_forever(listen_on(SOCK_STREAM, kUpstream, kSinkPort), sink);
  resolver(listen_on(SOCK_DGRAM, "127.0.0.1", kResolverPort));
  setenv("RLM_SANDBOX_RESOLVER", ("127.0.0.1:" + std::to_string(kResolverPort)).c_str(), 1);

  auto backend = rlm::make_backend("namespace");
  auto policy = rlm::load_policy_text(
      R"({"extends": "default", "limits": {"wall_time_ms": "120s", "cpu_time_ms": "120s"},
          "network": {"allow": ["bench.test:)" +
          std::to_string(kEchoPort) + R"(", "bench.test:)" + std::to_string(kSinkPort) + R"("]}})",
      "egress-bench.json");

  std::vector<double> direct_connect, relayed_connect, direct_bulk, relayed_bulk;
  for (long round = 0; round < g_rounds; ++round) {
    auto add = [](std::vector<double>& to, const std::vector<double>& from) {
      to.insert(to.end(), from.begin(), from.end());
    };
    add(direct_connect, run_direct("connect", g_connections));
    add(relayed_connect, run_sandboxed(*backend, policy, "connect", g_connections));
    add(direct_bulk, run_direct("bulk", g_bulk_mb));
    add(relayed_bulk, run_sandboxed(*backend, policy, "bulk", g_bulk_mb));
  }
  const double direct_ms = median(direct_connect), relayed_ms = median(relayed_connect);
  std::printf("rlm-egress-bench: %ld rounds, interleaved, in a network namespace of its own\n",
              g_rounds);
  std::printf("  connect + first byte (%zu connections each way)\n", direct_connect.size());
  std::printf("    direct (host netns)     median %.3f ms  p99 %.3f ms\n", direct_ms,
              percentile(direct_connect, 0.99));
  std::printf("    through the allowlist   median %.3f ms  p99 %.3f ms\n", relayed_ms,
              percentile(relayed_connect, 0.99));
  std::printf("    added: median %+.3f ms (target: at most +1 ms)\n", relayed_ms - direct_ms);
  const double direct_gib = median(direct_bulk), relayed_gib = median(relayed_bulk);
  std::printf("  bulk, %ld MiB a connection (median of %zu)\n", g_bulk_mb, direct_bulk.size());
  std::printf("    direct loopback         %.2f GiB/s\n", direct_gib);
  std::printf("    through the relay       %.2f GiB/s\n", relayed_gib);
  std::printf("    ratio: %.2f (target: at least 0.80)\n",
              direct_gib > 0 ? relayed_gib / direct_gib : 0.0);
  return 0;
}
