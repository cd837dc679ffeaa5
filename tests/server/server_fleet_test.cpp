// Placement across a fleet (issue 28, docs/fleet.md): three real `serve` nodes registering
// themselves in a directory; sessions spread by free room; a node killed with SIGKILL loses its
// sessions (node_lost) and is passed over; a drained node takes nothing new; a full fleet
// refuses at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "../cli/cli_test_util.hpp"
#include "raw_client.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/fleet.hpp"
#include "server/slurm_hostlist.hpp"
#include "server_fixture.hpp"
#include "support/scoped_env.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

constexpr auto kPatience = std::chrono::seconds(60);

// How clients reach the nodes: their unix sockets (endpoints the nodes register themselves), or
// TLS listeners on loopback ports (a fleet file of tls:// endpoints, clients with a certificate).
enum class Transport { unix_socket, tls };

std::string transport_name(const testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::tls ? "tls" : "unix";
}
void PrintTo(Transport transport, std::ostream* out) {
  *out << (transport == Transport::tls ? "tls" : "unix");
}

// The "tls" address a node's "listening" line gives (it listens on port 0), or "" until it says.
std::string tls_address_in(const std::string& log) {
  constexpr std::string_view kKey = "\"tls\":\"";
  const auto at = log.find(kKey);
  if (at == std::string::npos) return "";
  const auto end = log.find('"', at + kKey.size());
  return end == std::string::npos ? "" : log.substr(at + kKey.size(), end - at - kKey.size());
}

// Three nodes n1..n3, each with its own directory and socket, registered in `registry`; with
// Transport::tls each also listens on a loopback port, and fleet() places over TLS as alice.
class ThreeNodes {
 public:
  explicit ThreeNodes(std::vector<std::string> extra = {},
                      Transport transport = Transport::unix_socket)
      : transport_(transport) {
    if (transport_ == Transport::tls) {
      const ProcessOutcome made = run_process(
          {"/bin/sh", source_path("tests/server/make_tls_certs.sh"), certs.file("tls")});
      if (made.exit_code != 0) ADD_FAILURE() << "make_tls_certs.sh: " << made.err;
    }
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> args = {"--node-id",      "n" + std::to_string(i + 1),
                                       "--register",     registry.path(),
                                       "--session-pool", "python-repl=0",
                                       "--pool",         "default=1"};
      if (transport_ == Transport::tls)
        args.insert(args.end(), {"--listen", "127.0.0.1:0", "--tls-cert", cert("node.pem"),
                                 "--tls-key", cert("node.key"), "--client-ca", cert("ca.pem"),
                                 "--tls-identity", "alice=" + std::to_string(getuid())});
      args.insert(args.end(), extra.begin(), extra.end());
      servers.push_back(std::make_unique<ServerUnderTest>(dirs[i], args));
    }
  }
  bool ready() {
    for (const auto& server : servers)
      if (!server->ready()) return false;
    if (transport_ == Transport::unix_socket) return true;
    // Each node's TLS address, from its log (written once it serves), into a fleet file.
    std::string lines;
    for (const auto& server : servers) {
      std::string address;
      const auto deadline = std::chrono::steady_clock::now() + kPatience;
      while ((address = tls_address_in(server->log())).empty()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      lines += "tls://" + address + "\n";
    }
    certs.write("fleet.txt", lines);
    return true;
  }
  // The fleet as a client sees it: the registry of unix endpoints, or the file of tls:// ones.
  std::vector<std::string> endpoints() const {
    return read_fleet(transport_ == Transport::tls ? certs.file("fleet.txt") : registry.path());
  }
  FleetOptions options() const {
    FleetOptions options;
    if (transport_ == Transport::tls)
      options.tls = TlsFiles{cert("alice.pem"), cert("alice.key"), cert("ca.pem")};
    return options;
  }
  Fleet fleet() const { return Fleet(endpoints(), options()); }
  std::string logs() const {
    std::string text;
    for (const auto& server : servers) text += server->log();
    return text;
  }
  std::string cert(const std::string& name) const { return certs.file("tls/" + name); }

  TempDir registry;
  TempDir certs;
  TempDir dirs[3];
  std::vector<std::unique_ptr<ServerUnderTest>> servers;

 private:
  Transport transport_;
};

// The acceptance lines that hold whichever way clients reach the nodes.
class FleetOver : public testing::TestWithParam<Transport> {};
INSTANTIATE_TEST_SUITE_P(Transports, FleetOver,
                         testing::Values(Transport::unix_socket, Transport::tls), transport_name);

std::map<std::string, int> count_by_node(const std::vector<std::unique_ptr<Session>>& sessions) {
  std::map<std::string, int> counts;
  for (const auto& session : sessions) ++counts[session->node()];
  return counts;
}

TEST(Fleet, ReadsEndpointsFromAFileOrADirectoryAndRefusesOthers) {
  TempDir dir;
  dir.write("fleet.txt",
            "# three nodes\nunix:/run/a.sock\n\n  /run/b.sock  # b\nunix:/run/c.sock\n");
  EXPECT_EQ(read_fleet(dir.file("fleet.txt")),
            (std::vector<std::string>{"unix:/run/a.sock", "/run/b.sock", "unix:/run/c.sock"}));
  dir.write("remote.txt", "unix:/run/a.sock\ntls://10.0.0.1:7000\ntls://[::1]:7443\n");
  EXPECT_EQ(
      read_fleet(dir.file("remote.txt")),
      (std::vector<std::string>{"unix:/run/a.sock", "tls://10.0.0.1:7000", "tls://[::1]:7443"}));
  dir.write("bad.txt", "unix:/run/a.sock\ntls://10.0.0.1\n");
  try {
    read_fleet(dir.file("bad.txt"));
    ADD_FAILURE() << "a tls endpoint without a port was taken";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("line 2"), std::string::npos) << error.what();
  }
  dir.write("empty.txt", "# nobody\n");
  EXPECT_THROW(read_fleet(dir.file("empty.txt")), Error);
  EXPECT_THROW(read_fleet(dir.file("missing.txt")), Error);

  TempDir registry;
  registry.write("n2.endpoint", "unix:/run/n2.sock\n");
  registry.write("n1.endpoint", "unix:/run/n1.sock\n");
  registry.write("notes.txt", "not an endpoint\n");
  registry.write(".n3.endpoint.Ab12Cd", "unix:/run/n3.sock\n");  // being written: not yet
  // What others may leave in a shared registry is skipped, never followed or waited on.
  registry.write("evil.endpoint", "tcp://evil:1\n");
  ASSERT_EQ(mkfifo(registry.file("fifo.endpoint").c_str(), 0666), 0);
  ASSERT_EQ(symlink(dir.file("fleet.txt").c_str(), registry.file("link.endpoint").c_str()), 0);
  registry.write("long.endpoint", "unix:/" + std::string(8192, 'a') + "\n");
  EXPECT_EQ(read_fleet(registry.path()),
            (std::vector<std::string>{"unix:/run/n1.sock", "unix:/run/n2.sock"}));
  TempDir none;
  try {
    read_fleet(none.path());
    ADD_FAILURE() << "an empty registry was taken";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("registered"), std::string::npos) << error.what();
  }
}

// 24 sessions on three nodes of 12 spread 8/8/8 (by room, not by the cap); a node killed with
// SIGKILL: its sessions say node_lost within 2 s, its stale endpoint is passed over, and the next
// 24 sessions all land on the other two; a node removes its endpoint file when it stops.
TEST_P(FleetOver, SessionsSpreadByRoomAndADeadNodeIsPassedOver) {
  ThreeNodes nodes({"--max-sandboxes", "12"}, GetParam());
  ASSERT_TRUE(nodes.ready()) << nodes.logs();
  Fleet fleet = nodes.fleet();
  ASSERT_EQ(fleet.endpoints().size(), 3u);
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < 24; ++i) {
    sessions.push_back(fleet.open_session("python-repl", nullptr, {}));
    ASSERT_EQ(sessions.back()->execute("x = " + std::to_string(i)).status, CellStatus::ok);
  }
  EXPECT_EQ(count_by_node(sessions), (std::map<std::string, int>{{"n1", 8}, {"n2", 8}, {"n3", 8}}));

  // n3 dies without a word.
  nodes.servers[2]->kill_hard();
  for (auto& session : sessions) {
    if (session->node() != "n3") {
      EXPECT_EQ(session->execute("print(x)").status, CellStatus::ok);
      continue;
    }
    const auto before = std::chrono::steady_clock::now();
    const CellResult lost = session->execute("print(x)");
    EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(2));
    EXPECT_EQ(lost.status, CellStatus::session_error);
    EXPECT_NE(lost.error.find("node_lost"), std::string::npos) << lost.error;
    EXPECT_NE(lost.error.find("n3"), std::string::npos) << lost.error;
  }
  for (auto& session : sessions) session->close();
  sessions.clear();
  // The fleet still lists n3's endpoint (SIGKILL left its file); the next 24 go elsewhere.
  for (int i = 0; i < 24; ++i) sessions.push_back(fleet.open_session("python-repl", nullptr, {}));
  EXPECT_EQ(count_by_node(sessions), (std::map<std::string, int>{{"n1", 12}, {"n2", 12}}));
  for (auto& session : sessions) session->close();
  sessions.clear();
  const auto statuses = fleet.status();
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_FALSE(statuses[2].capacity.has_value());
  EXPECT_FALSE(statuses[2].error.empty());

  // A clean stop removes the node's endpoint file.
  EXPECT_EQ(nodes.servers[0]->stop(), 0);
  struct stat status {};
  EXPECT_NE(stat(nodes.registry.file("n1.endpoint").c_str(), &status), 0);
  EXPECT_EQ(stat(nodes.registry.file("n2.endpoint").c_str(), &status), 0);
}

// Runs, 30 at once on 24 slots: 24 run, 6 are refused resource_exhausted at once; none hangs.
TEST_P(FleetOver, ThirtyRunsOnTwentyFourSlotsRefuseSixCleanly) {
  ThreeNodes nodes({"--max-sandboxes", "8"}, GetParam());
  ASSERT_TRUE(nodes.ready()) << nodes.logs();
  Fleet fleet = nodes.fleet();
  // Each run holds its slot long after all 30 have asked, so they contend at once.
  std::vector<std::future<std::string>> runs;
  for (int i = 0; i < 30; ++i)
    runs.push_back(std::async(std::launch::async, [&] {
      Request request;
      request.argv = {"/bin/sleep", "5"};
      try {
        const Result result = fleet.run(request, "default");
        return result.status == Status::ok ? "ok:" + result.node : std::string("failed");
      } catch (const ServerRefused& refused) {
        return refused.kind();
      }
    }));
  std::map<std::string, int> outcomes;
  for (auto& run : runs) {
    ASSERT_EQ(run.wait_for(kPatience), std::future_status::ready) << "a run hung";
    ++outcomes[run.get()];
  }
  EXPECT_EQ(outcomes["resource_exhausted"], 6) << json(outcomes).dump();
  EXPECT_EQ(outcomes["ok:n1"] + outcomes["ok:n2"] + outcomes["ok:n3"], 24) << json(outcomes).dump();
}

// A Slurm job's node list as Slurm writes it, expanded as Slurm expands it; malformed or huge
// lists are refused before anything is made.
TEST(Fleet, ASlurmNodeListExpandsAsSlurmWritesIt) {
  using server::expand_slurm_hostlist;
  constexpr std::size_t kMax = 100'000;
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,07],gpu5", kMax),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("rack[1-2]-n[8-10]", kMax),
            (std::vector<std::string>{"rack1-n8", "rack1-n9", "rack1-n10", "rack2-n8", "rack2-n9",
                                      "rack2-n10"}));
  EXPECT_EQ(expand_slurm_hostlist("n[098-101]", kMax),
            (std::vector<std::string>{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_hostlist("localhost", kMax), (std::vector<std::string>{"localhost"}));
  EXPECT_EQ(expand_slurm_hostlist("a.example.org,b_1", kMax),
            (std::vector<std::string>{"a.example.org", "b_1"}));
  EXPECT_EQ(expand_slurm_hostlist(" n[1-2],\n m , ,", kMax),
            (std::vector<std::string>{"n1", "n2", "m"}));
  EXPECT_EQ(expand_slurm_hostlist("n[007-010]", kMax),
            (std::vector<std::string>{"n007", "n008", "n009", "n010"}));
  EXPECT_EQ(expand_slurm_hostlist("n[1-100000]", kMax).size(), kMax);
  EXPECT_EQ(expand_slurm_hostlist("h" + std::string(251, 'x') + "[1-2]", kMax).size(), 2u);
  const std::vector<std::string> bad_lists = {"",
                                              " , ",
                                              "n[1-3",
                                              "n[3-1]",
                                              "n[a-b]",
                                              "n[]",
                                              "n[1-2]x[",
                                              "n[0-999999999]",
                                              "n[1-1000]m[1-1000]",
                                              "n[1-99999],m[1-2]",
                                              "n[1-100000],x",
                                              "bad host",
                                              "n/1",
                                              "n[-1]",
                                              "n[1-1000000000000000000000]",
                                              "h" + std::string(252, 'x') + "[1-10]"};
  for (const std::string& bad : bad_lists) {
    try {
      const auto hosts = expand_slurm_hostlist(bad, kMax);
      ADD_FAILURE() << "'" << bad << "' gave " << hosts.size() << " hosts";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("Slurm node list"), std::string::npos)
          << error.what();
    }
  }
}

// --fleet slurm:PORT inside a Slurm job: the TLS listener on PORT of each of the job's nodes
// (SLURM_JOB_NODELIST); here one node, "localhost", which its certificate names.
TEST(Fleet, ASlurmJobsNodesAreAFleet) {
  {
    ScopedEnv list("SLURM_JOB_NODELIST", "node[1-3]");
    EXPECT_EQ(
        read_fleet("slurm:7443"),
        (std::vector<std::string>{"tls://node1:7443", "tls://node2:7443", "tls://node3:7443"}));
    for (const char* bad : {"slurm:", "slurm:0", "slurm:65536", "slurm:74x3", "slurm:-1"})
      EXPECT_THROW(read_fleet(bad), Error) << bad;
  }
  {  // A job step's list when the job's is unset or empty.
    ScopedEnv job("SLURM_JOB_NODELIST", "");
    ScopedEnv step("SLURM_NODELIST", "gpu7");
    EXPECT_EQ(read_fleet("slurm:7443"), (std::vector<std::string>{"tls://gpu7:7443"}));
  }
  {
    ScopedEnv job("SLURM_JOB_NODELIST", std::nullopt);
    ScopedEnv step("SLURM_NODELIST", std::nullopt);
    try {
      read_fleet("slurm:7443");
      ADD_FAILURE() << "a Slurm fleet outside a job was taken";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("SLURM_JOB_NODELIST"), std::string::npos)
          << error.what();
    }
  }
  TempDir certs, dir;
  ASSERT_EQ(run_process({"/bin/sh", source_path("tests/server/make_tls_certs.sh"), certs.path()})
                .exit_code,
            0);
  ServerUnderTest node(
      dir, {"--node-id", "s1", "--pool", "default=1", "--listen", "127.0.0.1:0", "--tls-cert",
            certs.file("node.pem"), "--tls-key", certs.file("node.key"), "--client-ca",
            certs.file("ca.pem"), "--tls-identity", "alice=" + std::to_string(getuid())});
  ASSERT_TRUE(node.ready()) << node.log();
  std::string address;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while ((address = tls_address_in(node.log())).empty() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string port = address.substr(address.rfind(':') + 1);
  ASSERT_FALSE(port.empty()) << node.log();
  ScopedEnv list("SLURM_JOB_NODELIST", "localhost");
  FleetOptions options;
  options.tls = TlsFiles{certs.file("alice.pem"), certs.file("alice.key"), certs.file("ca.pem")};
  Fleet fleet(read_fleet("slurm:" + port), options);
  Request request;
  request.argv = {"/bin/echo", "placed"};
  const Result result = fleet.run(request, "default");
  EXPECT_EQ(result.stdout_data, "placed\n");
  EXPECT_EQ(result.node, "s1");
  // The CLI takes the same source.
  auto ran =
      cli({"run", "--fleet", "slurm:" + port, "--tls-cert", certs.file("alice.pem"), "--tls-key",
           certs.file("alice.key"), "--tls-ca", certs.file("ca.pem"), "--", "/bin/echo", "hi"});
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_EQ(ran.out, "hi\n");
}

// A node that answers every connection with `answer` (bytes), then `trickle` one byte a second
// for as long as the client listens; as root, so the client's listener check lets it be asked.
class FakeNode {
 public:
  FakeNode(const TempDir& dir, std::string name, std::string answer, bool trickle = false)
      : path_(dir.file(name)), answer_(std::move(answer)), trickle_(trickle) {
    listener_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(listen(listener_, 16), 0);
    thread_ = std::thread([this] {
      for (;;) {
        const int connection = accept(listener_, nullptr, nullptr);
        if (connection < 0) return;
        char request[256];
        [[maybe_unused]] auto got = read(connection, request, sizeof request);
        send(connection, answer_.data(), answer_.size(), MSG_NOSIGNAL);
        for (int i = 0; trickle_ && i < 30 && !stopping_; ++i) {
          if (send(connection, "x", 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        close(connection);
      }
    });
  }
  ~FakeNode() {
    stopping_ = true;
    shutdown(listener_, SHUT_RDWR);
    thread_.join();
    close(listener_);
  }
  std::string endpoint() const { return "unix:" + path_; }

 private:
  std::string path_, answer_;
  bool trickle_;
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

std::string frame_of(const std::string& body) {
  const auto size = static_cast<std::uint32_t>(body.size());
  return std::string{char(size >> 24), char(size >> 16), char(size >> 8), char(size)} + body;
}

// Nodes that answer capacity with what would make room infinite, with the wrong types, or a frame
// that never ends: each is passed over in bounded time and the run lands on the real node.
TEST(Fleet, HostileCapacityAnswersArePassedOverInBoundedTime) {
  TempDir dir;
  ServerUnderTest real(dir, {"--node-id", "real", "--pool", "default=1"});
  ASSERT_TRUE(real.ready()) << real.log();
  TempDir fakes;
  FakeNode minus_infinity(fakes, "inf.sock",
                          frame_of(R"({"op":"capacity","draining":false,"warm_idle":)"
                                   R"({"p":{"sandboxes":-1.7e308,"sessions":-1.7e308}}})"));
  FakeNode wrong_types(fakes, "types.sock",
                       frame_of(R"({"op":"capacity","draining":"yes","features":null})"));
  FakeNode huge(fakes, "huge.sock", std::string("\x3f\xff\xff\xff"));  // a 1 GiB frame
  FakeNode trickling(fakes, "trickle.sock", std::string("\x00\x00\x03\xe8"), true);
  FleetOptions options;
  options.choices = 5;  // every node asked each round
  options.ask_timeout = std::chrono::milliseconds(1500);
  Fleet fleet({minus_infinity.endpoint(), wrong_types.endpoint(), huge.endpoint(),
               trickling.endpoint(), "unix:" + real.socket()},
              options);
  Request request;
  request.argv = {"/bin/true"};
  for (int i = 0; i < 3; ++i) {
    const auto started = std::chrono::steady_clock::now();
    EXPECT_EQ(fleet.run(request, "default").node, "real");
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  }
  // The hostile ones alone: the placement ends, refused, in bounded time (it once spun for ever
  // on a room of minus infinity).
  options.choices = 1;
  Fleet hostile(
      {minus_infinity.endpoint(), wrong_types.endpoint(), huge.endpoint(), trickling.endpoint()},
      options);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_NE(refusal_kind([&] { hostile.run(request, "default"); }), "(served)");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

// One uid holds at most its share of a node's slots (--max-sandboxes-per-uid); the server's own
// uid and other uids still get theirs.
TEST(Fleet, OneUidCannotHoldEverySlotOfASharedNode) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ServerUnderTest server(dir, {"--max-sandboxes", "4", "--max-sandboxes-per-uid", "2",
                               "--session-pool", "python-repl=0", "--pool", "default=1",
                               "--socket-mode", "0666", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto held = connections_as(65534, server.socket(), 3);
  ASSERT_EQ(held.size(), 3u);
  const std::string open = frame_bytes(R"({"op":"session_open","policy":"python-repl"})");
  for (int i = 0; i < 2; ++i) {
    send_bytes(held[i].get(), open);
    EXPECT_EQ(answer(held[i].get(), kPatience).value("op", ""), "session_opened");
  }
  send_bytes(held[2].get(), open);
  const json refused = answer(held[2].get(), kPatience);
  EXPECT_EQ(refused.value("kind", ""), "resource_exhausted") << refused.dump();
  EXPECT_NE(refused.value("message", "").find("share"), std::string::npos) << refused.dump();
  // The server's own uid is not held back by the tenant.
  Request request;
  request.argv = {"/bin/true"};
  EXPECT_EQ(ServerConnection(server.socket()).run(request, "default").status, Status::ok);
}

// A FIFO (or a symlink to an endless file) put in place of the node's endpoint file in a shared
// registry does not hold the server's stop, nor make it read without end.
TEST(Fleet, AnEndpointFileReplacedByAFifoDoesNotHoldTheStop) {
  TempDir registry, dir;
  ServerUnderTest server(dir,
                         {"--node-id", "f1", "--register", registry.path(), "--pool", "default=0"});
  ASSERT_TRUE(server.ready()) << server.log();
  ASSERT_EQ(unlink(registry.file("f1.endpoint").c_str()), 0);
  ASSERT_EQ(mkfifo(registry.file("f1.endpoint").c_str(), 0666), 0);
  EXPECT_EQ(server.stop(), 0) << "the stop did not end by itself";
  struct stat status {};
  EXPECT_EQ(lstat(registry.file("f1.endpoint").c_str(), &status), 0);
  EXPECT_TRUE(S_ISFIFO(status.st_mode)) << "what was not its own was removed";
}

// A run whose node dies after it started fails node_lost and is not started again elsewhere (its
// payload may have run: side effects must not happen twice).
TEST_P(FleetOver, ARunWhoseNodeDiesIsNotRunAgainElsewhere) {
  ThreeNodes nodes({}, GetParam());
  ASSERT_TRUE(nodes.ready()) << nodes.logs();
  Fleet fleet = nodes.fleet();
  auto run = std::async(std::launch::async, [&] {
    Request request;
    request.argv = {"/bin/sleep", "8"};
    return refusal_kind([&] { fleet.run(request, "default"); });
  });
  // The node that holds it, as its capacity says.
  std::size_t holder = 3;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (holder == 3 && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t i = 0; i < 3; ++i)
      if (ServerConnection(nodes.servers[i]->socket()).capacity()["running"] == 1) holder = i;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_LT(holder, 3u) << "no node ran it";
  nodes.servers[holder]->kill_hard();
  ASSERT_EQ(run.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(run.get(), "node_lost");
  for (std::size_t i = 0; i < 3; ++i) {
    if (i == holder) continue;
    EXPECT_FALSE(
        find_line(log_lines(nodes.servers[i]->log()), {{"event", "request"}, {"op", "run"}}))
        << "run again on node " << i + 1;
  }
}

// Two nodes registered under one id (a restart, a duplicate): the one that stops leaves the
// other's endpoint file alone.
TEST(Fleet, ANodeStoppingLeavesAnotherNodesEndpointOfTheSameId) {
  TempDir registry, first_dir, second_dir;
  const std::vector<std::string> args = {"--node-id",     "same",   "--register",
                                         registry.path(), "--pool", "default=0"};
  ServerUnderTest first(first_dir, args);
  ASSERT_TRUE(first.ready()) << first.log();
  ServerUnderTest second(second_dir, args);
  ASSERT_TRUE(second.ready()) << second.log();
  EXPECT_EQ(first.stop(), 0);
  EXPECT_EQ(read_fleet(registry.path()), (std::vector<std::string>{"unix:" + second.socket()}));
  EXPECT_EQ(second.stop(), 0);
  EXPECT_THROW(read_fleet(registry.path()), Error);
}

// A drained node takes nothing new; its session in progress finishes there and the node exits.
TEST_P(FleetOver, ADrainingNodeIsPassedOverWhileItsSessionsFinish) {
  constexpr auto kGrace = std::chrono::seconds(20);
  ThreeNodes nodes({"--drain-grace", "20s"}, GetParam());
  ASSERT_TRUE(nodes.ready()) << nodes.logs();
  Fleet fleet = nodes.fleet();
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < 3; ++i) sessions.push_back(fleet.open_session("python-repl", nullptr, {}));
  EXPECT_EQ(count_by_node(sessions), (std::map<std::string, int>{{"n1", 1}, {"n2", 1}, {"n3", 1}}));
  ServerConnection(nodes.servers[0]->socket()).drain();
  for (int i = 0; i < 9; ++i) {
    Request request;
    request.argv = {"/bin/true"};
    EXPECT_NE(fleet.run(request, "default").node, "n1");
  }
  for (auto& session : sessions) {
    EXPECT_EQ(session->execute("print(1)").stdout_data, "1\n") << session->node();
    session->close();
  }
  // Its sessions closed, it exits 0 within its grace (a second more for a loaded machine).
  EXPECT_EQ(nodes.servers[0]->exited_within(kGrace + std::chrono::seconds(1)), 0)
      << nodes.servers[0]->log();
}

// The CLI: run and repl place through --fleet; fleet status prints each node (and says which is
// down).
TEST(Fleet, TheCliPlacesThroughAFleetAndPrintsItsStatus) {
  ThreeNodes nodes({"--max-sandboxes", "4"});
  ASSERT_TRUE(nodes.ready()) << nodes.logs();
  auto ran = cli({"run", "--fleet", nodes.registry.path(), "--json", "--", "/bin/echo", "hi"});
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  const json result = json::parse(ran.out);
  EXPECT_EQ(result["stdout"], "hi\n");
  EXPECT_EQ(result["node"].get<std::string>().rfind("n", 0), 0u) << ran.out;

  auto status = cli({"fleet", "status", nodes.registry.path(), "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const json array = json::parse(status.out);
  ASSERT_EQ(array.size(), 3u);
  for (const auto& node : array) {
    EXPECT_EQ(node["max_sandboxes"], 4) << node.dump();
    EXPECT_TRUE(node.contains("ready") && node.contains("running") && node.contains("node_id"));
  }
  nodes.servers[1]->kill_hard();  // n2
  auto degraded = cli({"fleet", "status", nodes.registry.path()});
  EXPECT_EQ(degraded.exit_code, 1);
  EXPECT_NE(degraded.out.find("down"), std::string::npos) << degraded.out;
  EXPECT_NE(degraded.out.find(nodes.servers[1]->socket()), std::string::npos) << degraded.out;
  EXPECT_NE(degraded.out.find("n1 "), std::string::npos) << degraded.out;
  EXPECT_NE(degraded.out.find("n3 "), std::string::npos) << degraded.out;
  EXPECT_EQ(degraded.out.find("n2 "), std::string::npos) << degraded.out;
  auto both =
      cli({"run", "--fleet", nodes.registry.path(), "--server", "/tmp/x.sock", "--", "/bin/true"});
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("give one"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace rlm::test
