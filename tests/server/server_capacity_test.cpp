// Tenants of one server against its resources (issue 24): one uid holding every connection, a
// connection held open by chatting, stalled frames holding the server's memory.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "../cli/cli_test_util.hpp"
#include "raw_client.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/server.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

using host::UniqueFd;
using nlohmann::json;
using server::Clock;

constexpr uid_t kTenant = 65534;

void expect_served(const std::string& socket) {
  auto outcome = cli({"run", "--server", socket, "--", "/bin/echo", "ok"});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "ok\n");
}

// ---- One uid cannot hold the server's connections; nobody holds one open by chatting ----

TEST(ServerConnectionCaps, OneUidCannotTakeEveryConnection) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);  // the tenant must reach the socket
  ServerUnderTest server(
      dir, {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", std::to_string(kTenant),
            "--max-clients", "8", "--max-clients-per-uid", "2"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto held = connections_as(kTenant, server.socket(), 3);
  ASSERT_EQ(held.size(), 3u);
  const std::string hello = frame_bytes(R"({"op":"hello","version":1})");
  for (int i = 0; i < 2; ++i) {
    send_bytes(held[i].get(), hello);
    EXPECT_EQ(answer(held[i].get()).value("op", ""), "hello") << "connection " << i;
  }
  // The third is over the uid's cap: refused at once, saying which cap.
  const json refused = answer(held[2].get(), std::chrono::seconds(3));
  EXPECT_EQ(refused.value("kind", ""), "unavailable") << refused.dump();
  EXPECT_NE(refused.value("message", "").find("per uid"), std::string::npos) << refused.dump();
  EXPECT_NE(refused.value("message", "").find("uid 65534"), std::string::npos) << refused.dump();
  // The tenant keeps its two alive; the server's own uid is served meanwhile.
  for (int i = 0; i < 2; ++i) send_bytes(held[i].get(), hello);
  expect_served(server.socket());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(answer(held[i].get()).value("op", ""), "hello");
}

// A connection's count was forgotten after its fd was closed: a connection accepted in between got
// the same fd number, and its uid's count was taken for the old one's and never given back. A
// client polling status in a loop locked its own uid out (issue 26's attack on line 12). The
// tenant polls as fast as it can for 3 s, then both its slots must still be there.
TEST(ServerConnectionCaps, AConnectionsCountSurvivesItsFdNumberBeingReused) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir, {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid",
                               std::to_string(kTenant), "--max-clients-per-uid", "2"});
  ASSERT_TRUE(server.ready()) << server.log();
  const std::string status = frame_bytes(R"({"op":"status"})");
  const pid_t poller = fork();
  if (poller == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(kTenant, kTenant, kTenant) != 0 ||
        setresuid(kTenant, kTenant, kTenant) != 0)
      _exit(126);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    long served = 0;
    while (std::chrono::steady_clock::now() < end) {
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, server.socket().c_str(), sizeof address.sun_path - 1);
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) _exit(125);
      if (send(fd, status.data(), status.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(status.size()))
        _exit(124);
      char reply[65536];
      while (read(fd, reply, sizeof reply) > 0) {
      }
      close(fd);
      ++served;
    }
    _exit(served > 100 ? 0 : 123);
  }
  int wait_status = 0;
  ASSERT_EQ(waitpid(poller, &wait_status, 0), poller);
  ASSERT_TRUE(WIFEXITED(wait_status));
  ASSERT_EQ(WEXITSTATUS(wait_status), 0) << "the polling tenant failed";
  // Both of the tenant's slots are free again: neither connection is refused.
  auto held = connections_as(kTenant, server.socket(), 2);
  ASSERT_EQ(held.size(), 2u);
  for (auto& connection : held) {
    send_bytes(connection.get(), frame_bytes(R"({"op":"hello","version":1})"));
    const json reply = answer(connection.get(), std::chrono::seconds(10));
    EXPECT_EQ(reply.value("op", ""), "hello") << reply.dump();
  }
}

// A tenant refused in a loop (here: not on the allow list) cannot flood the log: its refusals
// take at most 20 lines a second, and a later line says how many were left out.
TEST(ServerLogBounds, ATenantRefusedInALoopTakesABoundedShareOfTheLog) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir, {"--pool", "default=0", "--socket-mode", "0666"});
  ASSERT_TRUE(server.ready()) << server.log();
  const auto begin = std::chrono::steady_clock::now();
  for (int round = 0; round < 4; ++round) {
    auto refused = connections_as(kTenant, server.socket(), 200);
    for (auto& connection : refused) (void)answer(connection.get(), std::chrono::seconds(10));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  // One more, in a later second: its line says how many of the tenant's were left out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto last = connections_as(kTenant, server.socket(), 1);
  ASSERT_EQ(last.size(), 1u);
  (void)answer(last[0].get(), std::chrono::seconds(10));
  const std::string log = server.log();
  std::size_t lines = 0;
  std::string last_line;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"refusal\"") == std::string::npos) continue;
    if (line.find("\"uid\":65534") == std::string::npos) continue;
    ++lines;
    last_line = line;
  }
  EXPECT_LE(static_cast<double>(lines), 20.0 * (seconds + 3))
      << lines << " lines for 801 refusals in " << seconds << " s";
  EXPECT_NE(last_line.find("\"suppressed\":"), std::string::npos) << last_line;
  expect_served(server.socket());
}

TEST(ServerConnectionCaps, HelloDoesNotHoldAConnectionPastTheNegotiationDeadline) {
  TempDir dir;
  ServerUnderTest server(dir, {"--pool", "default=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  UniqueFd connection(connect_raw(server.socket()));
  const std::string hello = frame_bytes(R"({"op":"hello","version":1})");
  // One hello a second, each inside the 5 s the next frame is given, would be served for ever.
  json last;
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < give_up) {
    // A hello sent after the server closed is lost; its error frame is still there to read.
    send_what_is_taken(connection.get(), hello, std::chrono::seconds(5));
    last = answer(connection.get());
    if (last.value("op", "") != "hello") break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  EXPECT_EQ(last.value("op", ""), "error") << "still served after a minute of hellos";
  EXPECT_NE(last.value("message", "").find("negotiat"), std::string::npos) << last.dump();
  char byte;
  // Closed: EOF, or a reset when a last hello was still unread.
  EXPECT_LE(recv(connection.get(), &byte, 1, 0), 0) << "the connection is closed";
}

TEST(ServerConnectionCaps, NegotiationFramesAreCounted) {
  TempDir dir;
  ServerUnderTest server(dir, {"--pool", "default=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  UniqueFd connection(connect_raw(server.socket()));
  const std::string hello = frame_bytes(R"({"op":"hello","version":1})");
  json last;
  int answered = 0;
  for (; answered < 1000; ++answered) {
    send_what_is_taken(connection.get(), hello, std::chrono::seconds(5));
    last = answer(connection.get());
    if (last.value("op", "") != "hello") break;
  }
  EXPECT_LT(answered, 1000);
  EXPECT_EQ(last.value("op", ""), "error") << last.dump();
  EXPECT_NE(last.value("message", "").find("frames"), std::string::npos) << last.dump();
}

// ---- Frames in flight have a budget: stalled ones cannot grow the server ----

TEST(ServerFrameBudget, StalledFramesBeyondTheBudgetAreRefusedAndTheMemoryComesBack) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(
      dir, {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", std::to_string(kTenant),
            "--max-bytes-in-flight", "40M", "--max-bytes-in-flight-per-uid", "32M"});
  ASSERT_TRUE(server.ready()) << server.log();
  expect_served(server.socket());  // the first run's threads and arenas are in the baseline
  const std::uint64_t baseline = resident_bytes(server.pid());
  ASSERT_GT(baseline, 0u);

  // Each frame announces 12 MiB and stalls after 10 MiB of its body.
  constexpr std::uint32_t kAnnounced = 12u << 20;
  const std::string begun =
      header(kAnnounced) + R"({"op":"hello","pad":")" + std::string((10u << 20) - 20, 'x');
  const auto stall = [&](int fd) { return send_what_is_taken(fd, begun); };
  // The server's uid: two frames (24 MiB) fit its 32 MiB share, the next four do not.
  std::vector<UniqueFd> own;
  for (int i = 0; i < 6; ++i) {
    own.emplace_back(connect_raw(server.socket()));
    stall(own.back().get());
  }
  // The tenant: one frame fits what is left of the 40 MiB (36 MiB in flight), the next do not.
  auto tenant = connections_as(kTenant, server.socket(), 3);
  ASSERT_EQ(tenant.size(), 3u);
  for (auto& fd : tenant) stall(fd.get());

  const auto refused_at_once = [&](int fd, const char* which) {
    const json reply = answer(fd, std::chrono::seconds(5));
    EXPECT_EQ(reply.value("kind", ""), "unavailable") << reply.dump();
    EXPECT_NE(reply.value("message", "").find(which), std::string::npos) << reply.dump();
  };
  for (int i = 2; i < 6; ++i) refused_at_once(own[i].get(), "per uid");
  for (int i = 1; i < 3; ++i) refused_at_once(tenant[i].get(), "server");

  // Three frames of 12 MiB are in flight at most (10 MiB of each received so far).
  const std::uint64_t stalled = resident_bytes(server.pid());
  EXPECT_LT(stalled, baseline + (3 * 12u << 20) + (24u << 20))
      << "baseline " << (baseline >> 20) << " MiB, stalled " << (stalled >> 20) << " MiB";
  expect_served(server.socket());  // a normal run is served meanwhile

  // The stalled frames are dropped (a frame begun must end within 10 s); the memory comes back.
  for (auto* fd : {&own[0], &own[1], &tenant[0]})
    EXPECT_NE(answer(fd->get(), std::chrono::seconds(60)).value("op", ""), "hello");
  own.clear();
  tenant.clear();
  std::uint64_t after = 0;
  for (int i = 0; i < 100; ++i) {
    after = resident_bytes(server.pid());
    if (after < baseline + (16u << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_LT(after, baseline + (16u << 20))
      << "baseline " << (baseline >> 20) << " MiB, after " << (after >> 20) << " MiB";
  expect_served(server.socket());
}

TEST(ServerConfigFile, TheTenantCapsAreReadAndDefaulted) {
  const ServerConfig defaults = server_config_from_json(json::object(), "test");
  EXPECT_EQ(defaults.clients_per_uid(), 16u) << "a quarter of 64";
  EXPECT_EQ(defaults.owner_reserve(), 4u);
  EXPECT_EQ(defaults.max_bytes_in_flight, 256u << 20);
  EXPECT_EQ(defaults.max_bytes_in_flight_per_uid, 64u << 20);
  const ServerConfig set = server_config_from_json({{"max_clients", 2u},
                                                    {"max_clients_per_uid", 1u},
                                                    {"max_bytes_in_flight", "100M"},
                                                    {"max_bytes_in_flight_per_uid", "10M"}},
                                                   "test");
  EXPECT_EQ(set.clients_per_uid(), 1u);
  EXPECT_EQ(set.owner_reserve(), 1u);
  EXPECT_EQ(set.max_bytes_in_flight, 100u << 20);
  EXPECT_EQ(set.max_bytes_in_flight_per_uid, 10u << 20);
  EXPECT_EQ(server_config_from_json({{"max_clients", 3u}}, "test").clients_per_uid(), 1u);
  EXPECT_THROW(server_config_from_json({{"max_clients_per_uid", "many"}}, "test"), Error);
}

TEST(ServerConfigFile, TheTlsListenerIsReadWithItsRevocationList) {
  const ServerConfig config = server_config_from_json(json::parse(R"({"tls": {
      "listen": "0.0.0.0:7443", "cert": "/etc/rlm/node.pem", "key": "/etc/rlm/node.key",
      "client_ca": "/etc/rlm/ca.pem", "client_crl": "/etc/rlm/crl.pem",
      "identities": {"ci": 1000}}})"),
                                                      "test");
  EXPECT_EQ(config.tls_listen, "0.0.0.0:7443");
  EXPECT_EQ(config.tls_client_ca, "/etc/rlm/ca.pem");
  EXPECT_EQ(config.tls_client_crl, "/etc/rlm/crl.pem");
  EXPECT_EQ(config.tls_identities.at("ci"), 1000u);
  EXPECT_THROW(server_config_from_json({{"tls", {{"crl", "/etc/rlm/crl.pem"}}}}, "test"), Error);
  EXPECT_THROW(server_config_from_json({{"tls", {{"client_crl", 7}}}}, "test"), Error);
}

}  // namespace
}  // namespace rlm::test
