// The server's TLS listener (docs/fleet.md, "Remote access"): runs and sessions through
// tls://127.0.0.1:PORT with their stdio streamed, each client certificate's identity a tenant
// with its uid's permits, and every way in refused that should be: no certificate, another CA's,
// an identity with no permits, plain TCP, a loosening request, hostile stream frames.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/session.hpp"
#include "server/remote_wire.hpp"
#include "server/tls.hpp"
#include "server/wire.hpp"
#include "server_fixture.hpp"
#include "support/server_process.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using server::Clock;

constexpr uid_t kBob = 65534;

class ServerTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--pool", "default=2", "--session-pool", "python-repl=1",
                                 "--allow-uid", std::to_string(kBob)},
                                60s, TlsListenerSetup{::getuid(), kBob});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  static TlsFiles files(const std::string& who, const std::string& ca = "ca.pem") {
    return {who.empty() ? "" : server_->tls_file(who + ".pem"),
            who.empty() ? "" : server_->tls_file(who + ".key"), server_->tls_file(ca)};
  }
  static const std::string& endpoint() { return server_->tls_endpoint(); }

  // The kind and message of what connecting as `who` and asking hello brings.
  static std::pair<std::string, std::string> refusal_of(const TlsFiles& tls) {
    try {
      ServerConnection(endpoint(), std::nullopt, tls).hello();
    } catch (const ServerRefused& refused) {
      return {refused.kind(), refused.what()};
    }
    return {"(served)", ""};
  }

  // A TLS connection of our own, to send what no client would, and the frames it reads.
  struct Raw {
    server::TlsStream stream;
    server::TlsFrameReader reader{1u << 20};
  };
  static std::unique_ptr<Raw> raw(const std::string& who = "alice") {
    const TlsFiles tls = files(who);
    auto context = server::TlsContext::for_client(tls.cert, tls.key, tls.ca);
    const auto where = server::split_host_port(endpoint().substr(6));
    const auto deadline = Clock::now() + 10s;
    return std::make_unique<Raw>(Raw{server::TlsStream::connect(
        context, server::connect_tcp(*where, deadline), where->host, endpoint(), deadline)});
  }
  static void send(Raw& raw, const json& frame) {
    server::send_tls_frame(raw.stream, frame, Clock::now() + 10s);
  }
  // The next frame within 10 s; nullopt when the server closed the connection.
  static std::optional<json> reply(Raw& raw) {
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      if (auto frame = raw.reader.next()) return frame;
      try {
        if (!raw.reader.fill(raw.stream)) return std::nullopt;
      } catch (const server::WireError&) {
        return std::nullopt;
      }
      std::this_thread::sleep_for(2ms);
    }
    return std::nullopt;
  }

  // Whether the server's log gets a line with `fields` within 10 s (it is written after the
  // client has its answer).
  static bool logged(const json& fields) {
    for (int i = 0; i < 1000; ++i) {
      if (find_line(log_lines(server_->log()), fields)) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  static ServerProcess* server_;
};
ServerProcess* ServerTls::server_ = nullptr;

TEST_F(ServerTls, ARunStreamsItsStdinInAndItsOutputOutInOrder) {
  Request request;
  request.argv = {"sh", "-c",
                  "cat; echo err >&2; head -c 300000 /dev/zero | tr '\\0' a; echo; exit 7"};
  request.stdin_data = "hello through TLS\n";
  const Result result =
      ServerConnection(endpoint(), std::nullopt, files("alice")).run(request, "default");
  EXPECT_EQ(result.status, Status::exit_nonzero) << result.to_json().dump();
  EXPECT_EQ(result.exit_code, 7);
  EXPECT_EQ(result.stdout_data, "hello through TLS\n" + std::string(300000, 'a') + "\n");
  EXPECT_EQ(result.stderr_data, "err\n");
  EXPECT_FALSE(result.node.empty());
  EXPECT_TRUE(logged({{"event", "end"}, {"op", "run"}, {"identity", "alice"}, {"exit_code", 7}}))
      << server_->log();
}

TEST_F(ServerTls, OutputPastTheCapEndsTheRunWithExactlyTheCap) {
  ServerConnection ask(endpoint(), std::nullopt, files("alice"));
  const std::uint64_t cap = ask.policy("default").limits.output_bytes;
  Request request;
  request.argv = {"sh", "-c", "head -c " + std::to_string(cap * 3) + " /dev/zero; sleep 20"};
  const Result result =
      ServerConnection(endpoint(), std::nullopt, files("alice")).run(request, "default");
  EXPECT_EQ(result.status, Status::output_limit) << result.to_json().dump();
  EXPECT_EQ(result.stdout_data.size(), cap);
  EXPECT_LT(result.wall, 15s) << "the cap stopped the run; it did not sleep its 20 s";
}

TEST_F(ServerTls, ASessionRunsCellsAnswersItsLmAndSavesAndLoadsThroughTheConnection) {
  SessionOptions options;
  options.context = "the context, streamed";
  options.llm = make_llm_handler("echo");
  auto session = ServerConnection(endpoint(), std::nullopt, files("alice"))
                     .open_session("python-repl", nullptr, std::move(options));
  EXPECT_FALSE(session->node().empty());
  auto cell = session->execute("print(context)\nprint(llm_query('over TLS'))\nx = 41");
  EXPECT_EQ(cell.status, CellStatus::ok) << cell.error;
  EXPECT_EQ(cell.stdout_data, "the context, streamed\necho: over TLS\n");
  auto added = session->add_context(ContextKind::context, {"more", false, ""}, {});
  EXPECT_EQ(added.status, CellStatus::ok) << added.error;
  EXPECT_EQ(session->execute("print(context_1)").stdout_data, "more\n");

  const TempDir dir;
  const std::string file = dir.file("state.save");
  auto saved = session->save(file);
  ASSERT_EQ(saved.status, CellStatus::ok) << saved.error;
  ASSERT_TRUE(saved.saved.has_value());
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<std::uint64_t>(in.tellg()), saved.saved->value("bytes", 0u))
      << "the save file arrived whole before the answer";
  EXPECT_EQ(session->execute("x = 0").status, CellStatus::ok);
  auto loaded = session->load(file);
  ASSERT_EQ(loaded.status, CellStatus::ok) << loaded.error;
  EXPECT_EQ(session->execute("print(x + 1)").stdout_data, "42\n");
  EXPECT_EQ(session->close().status, Status::ok);
}

TEST_F(ServerTls, AClientWithoutACertificateIsRefusedSayingWhy) {
  const auto [kind, message] = refusal_of(files(""));
  EXPECT_EQ(kind, "unavailable");
  EXPECT_NE(message.find("requires a client certificate"), std::string::npos) << message;
}

TEST_F(ServerTls, ACertificateOfAnotherCaIsRefusedThoughItsNameIsAllowed) {
  // stranger.pem says CN=alice, but another CA issued it.
  const auto [kind, message] = refusal_of(files("stranger"));
  EXPECT_EQ(kind, "unavailable");
  EXPECT_NE(message.find("does not accept this client certificate"), std::string::npos) << message;
  EXPECT_TRUE(logged({{"event", "refusal"}})) << server_->log();
}

TEST_F(ServerTls, AnIdentityWithoutPermitsIsRefused) {
  const auto [kind, message] = refusal_of(files("nobody"));
  EXPECT_EQ(kind, "refused");
  EXPECT_NE(message.find("'nobody'"), std::string::npos) << message;
  EXPECT_NE(message.find("no permits"), std::string::npos) << message;
}

TEST_F(ServerTls, AServerWhoseCertificateTheClientsCaDidNotIssueGetsNothing) {
  const auto [kind, message] = refusal_of(files("alice", "other-ca.pem"));
  EXPECT_EQ(kind, "unavailable");
  EXPECT_NE(message.find("does not verify"), std::string::npos) << message;
}

TEST_F(ServerTls, ALooseningRequestIsRefusedAsOnTheSocket) {
  ServerConnection connection(endpoint(), std::nullopt, files("alice"));
  Policy loose = connection.policy("default");
  loose.limits.memory_bytes *= 64;
  Request request;
  request.argv = {"true"};
  const auto kind = refusal_kind([&] { connection.run(request, "default", &loose); });
  EXPECT_EQ(kind, "refused");
}

TEST_F(ServerTls, PlainTcpIsAnsweredWithARefusalAndClosed) {
  const auto where = server::split_host_port(endpoint().substr(6));
  const auto socket = server::connect_tcp(*where, Clock::now() + 10s);
  fcntl(socket.get(), F_SETFL, fcntl(socket.get(), F_GETFL) & ~O_NONBLOCK);
  server::send_frame(socket.get(), {{"op", "hello"}, {"version", 1}}, Clock::now() + 10s);
  const auto frame = server::receive_frame(socket.get(), Clock::now() + 10s, 10s, 1u << 20);
  ASSERT_TRUE(frame);
  EXPECT_EQ(frame->message.value("op", ""), "error");
  EXPECT_NE(frame->message.value("message", "").find("TLS 1.3 only"), std::string::npos)
      << frame->message.dump();
}

// Each identity is a tenant with its uid's rights: bob (uid 65534) sees only his own, cannot end
// alice's run; the server's log names the identity.
TEST_F(ServerTls, AnIdentityIsATenantWithItsUidsRights) {
  std::optional<Result> long_run;
  std::thread alice([&] {
    Request request;
    request.argv = {"sleep", "8"};
    long_run = ServerConnection(endpoint(), std::nullopt, files("alice")).run(request, "default");
  });
  std::uint64_t id = 0;
  for (int i = 0; i < 500 && id == 0; ++i) {
    const json status = ServerConnection(server_->socket()).status();
    for (const auto& entry : status["running"])
      if (entry.value("op", "") == "run" && entry.value("uid", 0u) == ::getuid())
        id = entry.value("id", std::uint64_t{0});
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_NE(id, 0u);
  const json seen = ServerConnection(endpoint(), std::nullopt, files("bob")).status();
  EXPECT_EQ(seen.value("scope", ""), "own");
  EXPECT_TRUE(seen["running"].empty()) << seen.dump();
  EXPECT_EQ(
      refusal_kind([&] { ServerConnection(endpoint(), std::nullopt, files("bob")).kill(id); }),
      "refused");
  ServerConnection(endpoint(), std::nullopt, files("alice")).kill(id);
  alice.join();
  ASSERT_TRUE(long_run);
  EXPECT_EQ(long_run->status, Status::interrupted);
  EXPECT_TRUE(logged({{"event", "request"}, {"op", "status"}, {"identity", "bob"}}))
      << server_->log();
}

// Stream frames a real client never sends end that connection with an error frame; the server
// serves the next client as before.
TEST_F(ServerTls, HostileStreamFramesEndOnlyThatConnection) {
  const std::vector<std::pair<std::vector<json>, std::string>> attacks = {
      {{server::data_frame(99, "x")}, "not an open stream"},
      {{{{"op", "run"},
         {"policy", "default"},
         {"request", {{"argv", {"true"}}}},
         {"streams", json::array({{{"id", 1}, {"kind", "out"}},
                                  {{"id", 2}, {"kind", "out"}},
                                  {{"id", 3}, {"kind", "out"}}})}}},
       "must be of kind in"},
      {{{{"op", "run"},
         {"policy", "default"},
         {"request", {{"argv", {"cat"}}}},
         {"streams", json::array({{{"id", 1}, {"kind", "in"}},
                                  {{"id", 1}, {"kind", "out"}},
                                  {{"id", 2}, {"kind", "out"}}})}}},
       "already open"},
      {{{{"op", "hello"}, {"streams", json::array({{{"id", 1}, {"kind", "in"}}})}}},
       "does not take"},
      {{{{"op", "run"},
         {"policy", "default"},
         {"request", {{"argv", {"cat"}}}},
         {"streams", json::array({{{"id", 1}, {"kind", "in"}},
                                  {{"id", 2}, {"kind", "out"}},
                                  {{"id", 3}, {"kind", "out"}}})}},
        {{"op", "data"}, {"stream", 1}, {"data", "%%%%"}}},
       "not base64"},
  };
  for (const auto& [frames, expected] : attacks) {
    auto client = raw();
    for (const auto& frame : frames) send(*client, frame);
    std::optional<json> answer;
    while ((answer = reply(*client)) && answer->value("op", "") != "error") {
    }
    ASSERT_TRUE(answer) << "no error frame for " << frames.front().dump();
    EXPECT_NE(answer->value("message", "").find(expected), std::string::npos) << answer->dump();
    EXPECT_FALSE(reply(*client)) << "the connection stays open after " << frames.front().dump();
  }
  Request request;
  request.argv = {"echo", "still serving"};
  EXPECT_EQ(ServerConnection(endpoint(), std::nullopt, files("alice"))
                .run(request, "default")
                .stdout_data,
            "still serving\n");
}

// A client that goes away (its TLS connection closes) stops its run, as a unix client's hangup
// does.
TEST_F(ServerTls, AClientThatLeavesStopsItsRun) {
  const auto interrupted = [] {
    std::size_t count = 0;
    for (const auto& line : log_lines(server_->log()))
      count += line.value("event", "") == "end" && line.value("status", "") == "interrupted";
    return count;
  };
  const std::size_t before = interrupted();
  {
    auto client = raw();
    send(*client, {{"op", "run"},
                   {"policy", "default"},
                   {"request", {{"argv", {"sleep", "60"}}}},
                   {"streams", json::array({{{"id", 1}, {"kind", "in"}},
                                            {{"id", 2}, {"kind", "out"}},
                                            {{"id", 3}, {"kind", "out"}}})}});
    const auto started = reply(*client);
    ASSERT_TRUE(started);
    EXPECT_EQ(started->value("op", ""), "started");
  }
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {
    ended = interrupted() > before;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(ended) << server_->log();
}

// Op after op on one TLS connection: the server says "idle" when an op ends and the client keeps
// the connection for its next one (no handshake, no new TCP connection): every request of five
// runs in a row comes from the same address.
TEST_F(ServerTls, ConsecutiveRunsShareOneConnection) {
  // bob's certificate under paths of its own: no connection another test parked is taken.
  const TempDir dir;
  std::filesystem::copy_file(server_->tls_file("bob.pem"), dir.file("bob.pem"));
  std::filesystem::copy_file(server_->tls_file("bob.key"), dir.file("bob.key"));
  const TlsFiles own{dir.file("bob.pem"), dir.file("bob.key"), server_->tls_file("ca.pem")};
  const std::string marker = "keep-alive-" + std::to_string(::getpid());
  for (int i = 0; i < 5; ++i) {
    Request request;
    request.argv = {"echo", marker};
    EXPECT_EQ(ServerConnection(endpoint(), std::nullopt, own).run(request, "default").stdout_data,
              marker + "\n");
  }
  std::set<std::string> remotes;
  std::size_t runs = 0;
  for (const auto& line : log_lines(server_->log()))
    if (line.value("event", "") == "request" && line.value("op", "") == "run" &&
        line.value("identity", "") == "bob" && line.value("uid", 0u) == kBob) {
      ++runs;
      remotes.insert(line.value("remote", ""));
    }
  EXPECT_EQ(runs, 5u) << server_->log();
  std::string seen;
  for (const auto& remote : remotes) seen += remote + " ";
  EXPECT_EQ(remotes.size(), 1u) << "the runs came from " << seen;
}

// A client that hangs up on its op ("hangup", as a unix client closing its socket) stops the run;
// the server then says "idle" and the same connection serves the next op.
TEST_F(ServerTls, AHangupStopsTheRunAndTheConnectionServesTheNextOp) {
  auto client = raw();
  const json streams = json::array(
      {{{"id", 1}, {"kind", "in"}}, {{"id", 2}, {"kind", "out"}}, {{"id", 3}, {"kind", "out"}}});
  send(*client, {{"op", "run"},
                 {"policy", "default"},
                 {"request", {{"argv", {"sleep", "60"}}}},
                 {"streams", streams}});
  auto frame = reply(*client);
  ASSERT_TRUE(frame);
  EXPECT_EQ(frame->value("op", ""), "started");
  const auto start = Clock::now();
  send(*client, {{"op", "hangup"}});
  std::optional<json> result;
  while ((frame = reply(*client)) && frame->value("op", "") != "idle")
    if (frame->value("op", "") == "result") result = frame;
  ASSERT_TRUE(frame) << "no idle after the hangup";
  ASSERT_TRUE(result);
  EXPECT_EQ((*result)["result"].value("status", ""), "interrupted") << result->dump();
  EXPECT_LT(Clock::now() - start, 20s);

  send(*client, {{"op", "hello"}, {"version", 1}});
  frame = reply(*client);
  ASSERT_TRUE(frame);
  EXPECT_EQ(frame->value("op", ""), "hello") << frame->dump();
}

// One byte past the cap, many times over: whether the run ends before or after the gateway's stop
// reaches it, the result says output_limit and the client got exactly the cap.
TEST_F(ServerTls, OutputOneBytePastTheCapIsAlwaysOutputLimit) {
  ServerConnection ask(endpoint(), std::nullopt, files("alice"));
  const std::uint64_t cap = ask.policy("default").limits.output_bytes;
  for (int i = 0; i < 10; ++i) {
    Request request;
    request.argv = {"head", "-c", std::to_string(cap + 1), "/dev/zero"};
    const Result result =
        ServerConnection(endpoint(), std::nullopt, files("alice")).run(request, "default");
    EXPECT_EQ(result.status, Status::output_limit) << result.to_json().dump().substr(0, 400);
    EXPECT_TRUE(result.stdout_truncated);
    EXPECT_EQ(result.stdout_data.size(), cap);
  }
}

// Connections that never finish a handshake, all from one address, do not shut out a client
// from another: each address may hold an eighth of the server's handshakes.
TEST_F(ServerTls, StalledHandshakesFromOneAddressDoNotShutOutAnother) {
  const auto where = server::split_host_port(endpoint().substr(6));
  std::vector<host::UniqueFd> stalled;
  for (int i = 0; i < 80; ++i) {
    host::UniqueFd socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2
    ASSERT_EQ(bind(socket.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(where->port)));
    to.sin_addr.s_addr = htonl(0x7f000001);
    ASSERT_EQ(connect(socket.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    ::send(socket.get(), "\x16\x03\x01", 3, MSG_NOSIGNAL);  // a ClientHello that never ends
    stalled.push_back(std::move(socket));
  }
  std::this_thread::sleep_for(200ms);
  // A new connection (not one kept from an earlier test), with a handshake of its own.
  auto client = raw();
  send(*client, {{"op", "hello"}, {"version", server::kProtocolVersion}});
  const auto answer = reply(*client);
  ASSERT_TRUE(answer) << server_->log();
  EXPECT_EQ(answer->value("op", ""), "hello");
}

// A load's file is for a session: sent as a connection's first op it is refused at once, never
// gathered into memory.
TEST_F(ServerTls, ALoadOutsideASessionIsRefused) {
  auto client = raw();
  send(*client, {{"op", "load"}, {"streams", json::array({{{"id", 1}, {"kind", "file_in"}}})}});
  const auto answer = reply(*client);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->value("op", ""), "error");
  EXPECT_NE(answer->value("message", "").find("load is an op of a session"), std::string::npos)
      << answer->dump();
}

// Revokes `who`'s certificate with the test CA (make_tls_certs.sh) and puts the new list in place
// by rename, as an operator would.
bool revoke(const ServerProcess& server, const std::string& who) {
  for (const std::string& args :
       {"-revoke " + who + ".pem", std::string("-gencrl -out crl.new && mv crl.new crl.pem")}) {
    if (run_process({"/bin/sh", "-c",
                     "cd '" + server.tls_file("") + "' && openssl ca -config crl-db/ca.cnf " +
                         "-cert ca.pem -keyfile ca.key " + args + " 2>&1"})
            .exit_code != 0)
      return false;
  }
  return true;
}

// --client-crl: a certificate on the CA's revocation list is refused, saying so. The list is read
// again when its file changes (replaced by rename): a certificate revoked while the server runs is
// refused from then on -- a resumption of a session it made before included -- while others are
// served; a file put in its place that is no revocation list leaves the list in force.
TEST(ServerTlsRevocation, ARevokedCertificateIsRefusedAndANewListTakesEffect) {
  ServerProcess server({"--pool", "default=1", "--allow-uid", std::to_string(kBob)}, 60s,
                       TlsListenerSetup{::getuid(), kBob, true});
  const std::string endpoint = server.tls_endpoint();
  const auto files = [&](const std::string& who) {
    return TlsFiles{server.tls_file(who + ".pem"), server.tls_file(who + ".key"),
                    server.tls_file("ca.pem")};
  };
  const auto served = [&](const std::string& who) {
    try {
      ServerConnection(endpoint, std::nullopt, files(who)).hello();
      return std::string("served");
    } catch (const ServerRefused& refused) {
      return std::string(refused.what());
    }
  };
  const std::string revoked = served("revoked");
  EXPECT_NE(revoked.find("revoked this client certificate"), std::string::npos) << revoked;

  // alice, on connections of our own whose context keeps her session to resume.
  const TlsFiles alice = files("alice");
  const auto context = server::TlsContext::for_client(alice.cert, alice.key, alice.ca);
  bool resumed = false;  // whether the last connection resumed alice's session
  const auto hello_answered = [&] {
    const auto where = server::split_host_port(endpoint.substr(6));
    const auto deadline = Clock::now() + 10s;
    try {
      server::TlsStream stream = server::TlsStream::connect(
          context, server::connect_tcp(*where, deadline), where->host, endpoint, deadline);
      resumed = stream.resumed();
      server::send_tls_frame(stream, {{"op", "hello"}, {"version", server::kProtocolVersion}},
                             deadline);
      server::TlsFrameReader reader{1u << 20};
      while (Clock::now() < deadline) {
        if (auto frame = reader.next()) {
          stream.close_now();  // a clean end: the session stays resumable
          return frame->value("op", "") == "hello";
        }
        if (!reader.fill(stream)) return false;
        std::this_thread::sleep_for(2ms);
      }
    } catch (const server::WireError&) {
    }
    return false;
  };
  ASSERT_TRUE(hello_answered()) << server.log();
  EXPECT_FALSE(resumed);
  ASSERT_TRUE(hello_answered()) << server.log();
  EXPECT_TRUE(resumed) << "the second connection did not resume: the test would not show that "
                          "a session made before the revocation is not resumed after it";
  const auto logged = [&](const json& fields) {
    for (int i = 0; i < 500; ++i) {
      if (find_line(log_lines(server.log()), fields)) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };

  // alice revoked: a new list, renamed into place.
  const std::string dir = server.tls_file("");
  ASSERT_TRUE(revoke(server, "alice"));
  // The file is looked at once a second, when a client connects.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    refused = !hello_answered();
    if (!refused) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(refused) << "alice was still served 10 s after her certificate was revoked";
  // Her client still offers the session it resumed above; the server, with the new list, did
  // not take it (a full handshake, refused).
  EXPECT_FALSE(resumed);
  EXPECT_TRUE(logged({{"event", "client_crl"}, {"loaded", true}})) << server.log();
  EXPECT_EQ(served("bob"), "served");

  // Not a revocation list: the one in force stays (alice refused, bob served).
  {
    std::ofstream(dir + "/crl.bad")
        << "-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n";
  }
  ASSERT_EQ(std::rename((dir + "/crl.bad").c_str(), (dir + "/crl.pem").c_str()), 0);
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(hello_answered());
  EXPECT_TRUE(logged({{"event", "client_crl"}, {"loaded", false}})) << server.log();
  EXPECT_EQ(served("bob"), "served");
}

// A revocation reaches connections already open, not only new ones: a cell of alice's running
// when her certificate is revoked ends within seconds (not its 60 s), her session and its sandbox
// with it, saying why; bob's session on the same server goes on.
TEST(ServerTlsRevocation, ARevocationEndsTheSessionsItsCertificateHoldsOpen) {
  ServerProcess server({"--session-pool", "python-repl=1", "--allow-uid", std::to_string(kBob)},
                       60s, TlsListenerSetup{::getuid(), kBob, true});
  const auto open = [&](const std::string& who) {
    return ServerConnection(server.tls_endpoint(), std::nullopt,
                            TlsFiles{server.tls_file(who + ".pem"), server.tls_file(who + ".key"),
                                     server.tls_file("ca.pem")})
        .open_session("python-repl", nullptr, SessionOptions{});
  };
  auto alice = open("alice");
  auto bob = open("bob");
  ASSERT_EQ(alice->execute("x = 1").status, CellStatus::ok);
  ASSERT_EQ(bob->execute("y = 2").status, CellStatus::ok);

  auto cell =
      std::async(std::launch::async, [&] { return alice->execute("import time\ntime.sleep(60)"); });
  std::this_thread::sleep_for(300ms);  // the cell under way (were it not, the cut is the same)
  ASSERT_TRUE(revoke(server, "alice"));

  ASSERT_EQ(cell.wait_for(30s), std::future_status::ready)
      << "alice's cell still ran 30 s after her certificate was revoked\n"
      << server.log();
  const CellResult cut = cell.get();
  EXPECT_EQ(cut.status, CellStatus::session_error) << cut.error;
  EXPECT_NE(cut.error.find("revoked"), std::string::npos) << cut.error;
  EXPECT_THROW(alice->execute("print(x)"), Error);  // as any session that ended
  // The session's end is logged once its sandbox is gone: at once, not when the cell's 60 s end.
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {
    for (const auto& line : log_lines(server.log()))
      ended = ended || (line.value("event", "") == "end" && line.value("identity", "") == "alice" &&
                        line.value("reason", "")
                            .starts_with("connection cut: the server has "
                                         "revoked this client certificate"));
    if (!ended) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(ended) << server.log();

  const CellResult other = bob->execute("print(y)");
  EXPECT_EQ(other.status, CellStatus::ok) << other.error;
  EXPECT_EQ(other.stdout_data, "2\n");
}

}  // namespace
}  // namespace rlm::test
