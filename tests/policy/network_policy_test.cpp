// "network" as an egress allowlist (issue 27, the policy): its entries read and checked with every
// bad one named at its JSON path, round-tripped, narrowed only (a server's client, run
// --allow-net), and -- since no build enforces it yet -- refused by every backend before anything
// runs, never run with more network than it asks for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "policy_test_helpers.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

std::string with_network(const json& network) {
  return json{{"extends", "default"}, {"network", network}}.dump();
}

Policy allowlist(const json& network) {
  return load_policy_text(with_network(network), "test.json");
}

TEST(NetworkPolicy, EveryEntryFormReadsAndRoundTrips) {
  const json network = {
      {"allow",
       {"pypi.org:443", "https://files.pythonhosted.org", "http://deb.debian.org",
        "*.githubusercontent.com:443", "host.test:8000-8100", "10.0.0.0/8:5432",
        "[2001:db8::/32]:443", "xn--bcher-kva.example:443"}},
      {"deny", {"evil.pypi.org", "*.bad.githubusercontent.com:443", "10.9.0.0/16"}},
      {"private", true},
      {"inject",
       {{{"host", "pypi.org:443"}, {"header", "Authorization"}, {"value_from_env", "PYPI_TOKEN"}}}},
      {"limits",
       {{"connections", 8}, {"names", 100}, {"idle_ms", "30s"}, {"connection_bytes", "64M"}}}};
  const Policy policy = allowlist(network);
  ASSERT_EQ(policy.network, Network::allowlist);
  EXPECT_TRUE(policy.namespaces.net);
  ASSERT_EQ(policy.egress.allow.size(), 8u);
  const auto& https = policy.egress.allow[1];
  EXPECT_EQ(https.scheme, NetworkRule::Scheme::https);
  EXPECT_EQ(https.first_port, 443);
  EXPECT_EQ(policy.egress.allow[2].first_port, 80);
  EXPECT_EQ(policy.egress.allow[3].kind, NetworkRule::Kind::wildcard);
  EXPECT_EQ(policy.egress.allow[3].name, "githubusercontent.com");
  EXPECT_EQ(policy.egress.allow[4].last_port, 8100);
  EXPECT_EQ(policy.egress.allow[5].kind, NetworkRule::Kind::cidr);
  EXPECT_EQ(policy.egress.allow[5].prefix, 8u);
  EXPECT_TRUE(policy.egress.allow[6].ipv6);
  EXPECT_EQ(policy.egress.deny[0].first_port, 0) << "a deny entry without a port: every port";
  EXPECT_TRUE(policy.egress.allow_private);
  ASSERT_EQ(policy.egress.inject.size(), 1u);
  EXPECT_EQ(policy.egress.limits.connections, 8u);
  EXPECT_EQ(policy.egress.limits.idle, std::chrono::seconds(30));
  EXPECT_EQ(policy.egress.limits.connection_bytes, 64u << 20);
  // The effective policy reads back as itself.
  const json shown = policy.to_json();
  EXPECT_EQ(shown["network"]["allow"], network["allow"]);
  EXPECT_EQ(policy_from_json(shown, "shown").to_json(), shown);
}

TEST(NetworkPolicy, EveryBadEntryIsNamedAtItsPathWithTheFix) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"pypi.org", "needs a port (pypi.org:443), or say the protocol: https://pypi.org"},
      {"PyPI.org:443", "names are written in lowercase"},
      {"pypi.org.:443", "a name ends without a dot"},
      {"*:443", "no bare *"},
      {"*.com:443", "not a whole top-level domain"},
      {"a.*.example.com:443", "* stands only for the leftmost labels"},
      {"-a.example:443", "each label of a name is 1 to 63"},
      {"1.2.3.4:80", "an address is named by a CIDR entry (1.2.3.4/32:PORT)"},
      {"10.0.0.1/8:22", "bits set beyond its prefix"},
      {"10.0.0.0/33:22", "the prefix length must be 0 to 32"},
      {"2001:db8::/32:443", "an IPv6 address is written in brackets"},
      {"[2001:db8::1]:443", "an address needs its prefix length: write 2001:db8::1/128"},
      {"[2001:db8::/32]", "needs a port"},
      {"pypi.org:0", "the port must be 1 to 65535"},
      {"pypi.org:70000", "the port must be 1 to 65535"},
      {"pypi.org:90-80", "the port must be 1 to 65535, or a range FIRST-LAST"},
      {"https://pypi.org:8443", "https:// takes a name only"},
      {"http://pypi.org/simple", "http:// takes a name only"},
  };
  json allow = json::array();
  for (const auto& [entry, said] : cases) allow.push_back(entry);
  const auto found = problems_in(with_network({{"allow", allow}}));
  ASSERT_EQ(found.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(found[i].path, "network.allow[" + std::to_string(i) + "]") << cases[i].first;
    EXPECT_NE(found[i].message.find(cases[i].second), std::string::npos)
        << cases[i].first << ": " << found[i].message;
  }
  // Beside the entries: unknown keys, a value given inline, an injection for a host not allowed.
  const auto more = problems_in(with_network(
      {{"allow", {"pypi.org:443"}},
       {"allow_all", true},
       {"inject",
        {{{"host", "api.other.org:443"}, {"header", "Authorization"}, {"value_from_env", "T"}},
         {{"host", "pypi.org:443"}, {"header", "X Y"}, {"value", "secret"}}}}}));
  std::string listed;
  for (const auto& d : more) listed += d.to_string() + "\n";
  EXPECT_NE(listed.find("network.allow_all: unknown key"), std::string::npos) << listed;
  EXPECT_NE(listed.find("network.inject[0].host: \"api.other.org:443\" is not allowed"),
            std::string::npos)
      << listed;
  EXPECT_NE(listed.find("network.inject[1].header: \"X Y\": not an HTTP header name"),
            std::string::npos)
      << listed;
  EXPECT_NE(listed.find("the value itself is never written in a policy"), std::string::npos)
      << listed;
}

TEST(NetworkPolicy, NothingAllowedIsNoNetworkAndAnAllowlistNeedsItsOwnNamespace) {
  EXPECT_EQ(allowlist({{"allow", json::array()}}).network, Network::none);
  const auto found = problems_in(json{
      {"extends", "default"},
      {"network", {{"allow", {"pypi.org:443"}}}},
      {"namespaces",
       {{"net", false}}}}.dump());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, "namespaces.net");
}

// A server's client and `run --allow-net` may only narrow.
TEST(NetworkPolicy, AnAllowlistOnlyNarrows) {
  const Policy base = allowlist(
      {{"allow", {"pypi.org:443", "*.example.com:443", "10.0.0.0/8:1-65535", "https://a.test"}},
       {"deny", {"evil.example.com"}},
       {"inject",
        {{{"host", "pypi.org:443"}, {"header", "Authorization"}, {"value_from_env", "T"}}}}});
  const auto loosened = [&](const json& network) {
    return loosenings(base, allowlist(network), {});
  };
  EXPECT_TRUE(loosened({{"allow",
                         {"pypi.org:443", "x.example.com:443", "*.b.example.com:443",
                          "10.1.0.0/16:5432", "https://a.test"}},
                        {"deny", {"evil.example.com", "more.example.com"}}})
                  .empty());
  for (const char* wider : {"other.org:443", "example.com:443", "pypi.org:80", "11.0.0.0/8:1",
                            "0.0.0.0/0:443", "http://a.test", "*.example.com:1-65535"}) {
    const auto found = loosened({{"allow", {wider}}, {"deny", {"evil.example.com"}}});
    ASSERT_EQ(found.size(), 1u) << wider;
    EXPECT_EQ(found[0].path, "network.allow[0]") << wider;
  }
  EXPECT_EQ(loosened({{"allow", {"pypi.org:443"}}})[0].path, "network.deny");
  EXPECT_EQ(
      loosened({{"allow", {"pypi.org:443"}}, {"deny", {"evil.example.com"}}, {"private", true}})[0]
          .path,
      "network.private");
  EXPECT_EQ(
      loosened({{"allow", {"pypi.org:443"}},
                {"deny", {"evil.example.com"}},
                {"inject",
                 {{{"host", "pypi.org:443"}, {"header", "Cookie"}, {"value_from_env", "T"}}}}})[0]
          .path,
      "network.inject[0]");
  EXPECT_EQ(loosened({{"allow", {"pypi.org:443"}},
                      {"deny", {"evil.example.com"}},
                      {"limits", {{"connections", 65}}}})[0]
                .path,
            "network.limits.connections");
  EXPECT_EQ(loosened({{"allow", {"pypi.org:443"}},
                      {"deny", {"evil.example.com"}},
                      {"limits", {{"connection_bytes", "5G"}}}})[0]
                .path,
            "network.limits.connection_bytes");
  // none < an allowlist < host.
  const Policy none = load_policy("default");
  EXPECT_FALSE(loosenings(none, base, {}).empty());
  EXPECT_TRUE(loosenings(base, none, {}).empty());
  Policy host = none;
  host.network = Network::host;
  host.namespaces.net = false;
  EXPECT_TRUE(loosenings(host, base, {}).empty());
  EXPECT_FALSE(loosenings(base, host, {}).empty());
}

TEST(NetworkPolicy, NarrowingForRunAllowNet) {
  Policy host = load_policy("default");
  host.network = Network::host;
  host.namespaces.net = false;
  const Policy narrowed = narrow_network(host, {"pypi.org:443", "https://files.pythonhosted.org"});
  EXPECT_EQ(narrowed.network, Network::allowlist);
  EXPECT_TRUE(narrowed.namespaces.net);
  EXPECT_EQ(narrowed.egress.allow.size(), 2u);
  EXPECT_THROW(narrow_network(load_policy("default"), {"pypi.org:443"}), Error);
  EXPECT_THROW(narrow_network(host, {"pypi.org"}), PolicyError);
  const Policy base = allowlist(
      {{"allow", {"pypi.org:443", "api.test:443"}},
       {"inject",
        {{{"host", "api.test:443"}, {"header", "Authorization"}, {"value_from_env", "T"}}}}});
  try {
    narrow_network(base, {"other.org:443"});
    ADD_FAILURE() << "an entry outside the allowlist was taken";
  } catch (const PolicyError&) {
    ADD_FAILURE() << "a well-formed entry was called malformed";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not within the policy's allowlist"),
              std::string::npos);
  }
  const Policy kept = narrow_network(base, {"pypi.org:443"});
  EXPECT_TRUE(kept.egress.inject.empty()) << "an injection for a host no longer allowed stays";
}

// Fail closed. The namespace and docker backends enforce an allowlist (tests/egress); everywhere
// else, and for credential injection, the policy is refused before its payload can run (docker's
// refusal of an injection: EgressDocker.AnInjectionIsRefusedBeforeAnythingRuns).
TEST(NetworkPolicy, AnAllowlistIsRefusedWhereverItIsNotEnforced) {
  Policy policy = allowlist({{"allow", {"pypi.org:443"}}});
  policy.backend.allow_unisolated = true;
  const std::string marker = "/tmp/rlm-allowlist-ran-" + std::to_string(getpid());
  Request request;
  request.argv = {"/bin/sh", "-c", "touch " + marker};
  for (const char* name : {"landlock", "local"}) {
    auto backend = make_backend(name);
    ASSERT_TRUE(backend) << name;
    const Result result = backend->run(request, policy);
    EXPECT_EQ(result.status, Status::sandbox_error) << name << ": " << result.detail;
    EXPECT_NE(result.detail.find("does not enforce an egress allowlist"), std::string::npos)
        << name << ": " << result.detail;
    EXPECT_FALSE(std::filesystem::exists(marker)) << name << " ran the payload";
  }
  Policy injecting = allowlist(
      {{"allow", {"pypi.org:443"}},
       {"inject", {{{"host", "pypi.org:443"}, {"header", "X-Token"}, {"value_from_env", "T"}}}}});
  const Result result = make_backend("namespace")->run(request, injecting);
  EXPECT_EQ(result.status, Status::sandbox_error) << result.detail;
  EXPECT_NE(result.detail.find("network.inject"), std::string::npos) << result.detail;
  std::filesystem::remove(marker);
}

}  // namespace
}  // namespace rlm::test
