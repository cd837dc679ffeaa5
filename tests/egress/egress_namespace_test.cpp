// An egress allowlist on the namespace backend: the rules (egress_suite.cpp, instantiated here),
// and the paths only this backend has -- a REPL session's cells and its live narrowing, a pool's
// warm sandboxes, runs through the server.
#include <fstream>
#include <sstream>
#include <thread>

#include "egress_credentials.hpp"
#include "egress_suite.hpp"
#include "namespace/namespace_backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/pool.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/server_process.hpp"

namespace rlm::test {

std::string egress_backend_unavailable(const std::string&) {
  return "";  // EgressFixture::SetUp skips where the world itself cannot be made
}

// "server": the namespace backend through `rlm-sandbox serve` (EgressFixture::server()).
INSTANTIATE_TEST_SUITE_P(On, EgressSuite, ::testing::Values("namespace", "server"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(On, EgressCredentials, ::testing::Values("namespace", "server"),
                         [](const auto& info) { return info.param; });

namespace {

using namespace std::chrono_literals;
using nlohmann::json;

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
                               public ::testing::WithParamInterface<bool /*through a server*/> {
 protected:
  // A session of `repl`, directly or (GetParam()) through a server offering it as a warm session.
  std::unique_ptr<Session> open_session(const Policy& repl) {
    if (!GetParam()) return ns::make_namespace_backend()->open_session(repl, {});
    const std::string offered = world_.dir().file("offered-" + std::to_string(++opened_) + ".json");
    std::ofstream(offered) << repl.to_json().dump();
    server_.emplace(std::vector<std::string>{"--session-pool", offered + "=1"});
    return ServerConnection(server_->socket()).open_session(offered, nullptr, {});
  }
  // python-repl with `allow` as its allowlist and a minute of time, in this world.
  Policy repl_policy(const std::vector<std::string>& allow) {
    Policy repl =
        load_policy_text(json{{"extends", "python-repl"},
                              {"network", {{"allow", allow}}},
                              {"limits", {{"wall_time_ms", "60s"}, {"cpu_time_ms", "60s"}}}}
                             .dump(),
                         "egress-repl.json");
    world_.bind_into(repl);
    return repl;
  }
  // One cell of `session`, which must run to its end.
  static CellResult cell(Session& session, const std::string& code) {
    auto result = session.execute(code, std::chrono::seconds(40));
    EXPECT_EQ(result.status, CellStatus::ok) << result.error << result.stderr_data;
    return result;
  }
  std::optional<ServerProcess> server_;
  int opened_ = 0;
};

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
  auto session = open_session(repl_policy({"pypi.test:443", "echo.test:5432"}));
  auto cell = [&](const std::string& code) { return this->cell(*session, code); };
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

// A narrowing judges a connection on all it passed, not only its (name, port): one pinned to a
// private upstream that only a dropped CIDR entry allowed ends; one let through as raw bytes ends
// when its name's entry now asks for an HTTP check; and one still in its check when the list
// drops its name is never resolved nor dialled.
TEST_P(EgressSessionNarrowing, ANarrowingJudgesAllAConnectionPassed) {
  auto session = open_session(
      repl_policy({"rebind.test:5432", "127.0.0.0/8:5432", "web.test:80", "pypi.test:443"}));
  auto cell = [&](const std::string& code) { return this->cell(*session, code).stdout_data; };
  cell(kPrelude);
  EXPECT_EQ(cell(R"PY(
private = socket.create_connection(("rebind.test", 5432), timeout=10)
private.sendall(b"one")
raw = socket.create_connection(("web.test", 80), timeout=10)
checking = socket.create_connection(("pypi.test", 443), timeout=10)
hello = client_hello("pypi.test")
checking.sendall(hello[:10])
print(private.recv(16))
)PY"),
            "b'one'\n");
  ASSERT_FALSE(world_.queried("pypi.test")) << "asked before its hello was whole";

  // rebind.test stays, but only as a public name; web.test only for checked HTTP requests;
  // pypi.test goes.
  session->narrow_network({"rebind.test:5432", "http://web.test"});
  const auto after = lines_of(cell(R"PY(
def ended(conn, data):
    try:
        conn.settimeout(10)
        conn.sendall(data)
        return conn.recv(64) == b""
    except OSError:
        return True
print(ended(private, b"two"))
print(ended(raw, b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
print(ended(checking, hello[10:]))
)PY"));
  EXPECT_EQ(after, (std::vector<std::string>{"True", "True", "True"}));
  EXPECT_FALSE(world_.queried("pypi.test")) << "a dropped name was resolved after the narrowing";
  for (const auto& request : world_.requests())
    EXPECT_EQ(request.find("evil.test"), std::string::npos) << request;
  session->close();
}

TEST_P(EgressSessionNarrowing, ASessionWithoutAnAllowlistHasNothingToNarrow) {
  Policy repl = load_policy_text(json{{"extends", "python-repl"}}.dump(), "repl.json");
  auto session = open_session(repl);
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

// Through `rlm-sandbox serve` (the static binary, started with the secret in its environment):
// a client's run of an offered policy gets the credential injected; a client cannot add an
// injection of its own (it could name any of the server's variables or files and send the value
// to a host of its choosing).
TEST_P(EgressCredentials, ThroughTheServerTheCredentialIsInjectedAndNoClientAddsOne) {
  const std::string offered = world_.dir().file("offered-inject.json");
  std::ofstream(offered) << injecting({{"value_from_env", kSecretVariable}}).to_json().dump();
  ServerProcess server({"--pool", offered + "=1"});
  Request request;
  request.argv = {"python3", "-c", R"PY(
import os, urllib.request
print(urllib.request.urlopen("https://api.test/", timeout=20).read().decode())
print(os.environ.get("RLM_TEST_INJECTED_TOKEN"))
)PY"};
  const auto result = ServerConnection(server.socket()).run(request, offered);
  ASSERT_EQ(result.status, Status::ok) << describe(result) << server.log();
  EXPECT_EQ(result.stdout_data, "tls ok sni=api.test\nNone\n");
  bool injected = false;
  for (const auto& line : world_.requests())
    injected |= line.find("Authorization: sha256:" + sha256_hex(secret_)) != std::string::npos;
  EXPECT_TRUE(injected);

  Policy widened = ServerConnection(server.socket()).policy(offered);
  widened.egress.inject.push_back(widened.egress.inject.front());
  widened.egress.inject.back().value_from_env = "HOME";
  EXPECT_THROW(ServerConnection(server.socket()).run(request, offered, &widened), ServerRefused);
}

}  // namespace
}  // namespace rlm::test
