// The host side's pure decisions (runtime/egress/): which rule a name or address meets, which
// addresses are private, and that the upstream is never asked about a name that is not a host
// name.
#include <gtest/gtest.h>

#include "egress/address.hpp"
#include "egress/rules.hpp"
#include "egress/upstream.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::egress {
namespace {

IpAddress address(const std::string& text) {
  const auto endpoint =
      parse_endpoint(text.find(':') != std::string::npos ? "[" + text + "]:1" : text + ":1");
  EXPECT_TRUE(endpoint) << text;
  return endpoint ? endpoint->address : IpAddress{};
}

Egress egress(const nlohmann::json& network) {
  return load_policy_text(nlohmann::json{{"extends", "default"}, {"network", network}}.dump(),
                          "rules-test.json")
      .egress;
}

TEST(EgressAddress, PrivateRangesIncludeTheOnesTunnelledInIpv6) {
  for (const char* text : {"127.0.0.1",
                           "10.1.2.3",
                           "172.16.0.1",
                           "192.168.1.1",
                           "169.254.169.254",
                           "100.64.0.1",
                           "198.18.0.1",
                           "0.0.0.0",
                           "224.0.0.1",
                           "::1",
                           "::",
                           "fc00::1",
                           "fe80::1",
                           "ff02::1",
                           "::ffff:127.0.0.1",
                           "64:ff9b::a9fe:a9fe",
                           "64:ff9b:1::1",
                           "2002:7f00:1::",
                           "2002:a9fe:a9fe::1",
                           "2001:0:4136:e378::1"})
    EXPECT_TRUE(is_private(address(text))) << text;
  for (const char* text :
       {"203.0.113.10", "8.8.8.8", "2606:4700::1111", "2002:cb00:710a::1", "64:ff9b::808:808"})
    EXPECT_FALSE(is_private(address(text))) << text;
}

TEST(EgressRules, WildcardsDenyAndPortsDecideTheRule) {
  const auto rules = egress({{"allow", {"*.cdn.test:443", "pypi.test:443", "10.0.0.0/8:5432"}},
                             {"deny", {"evil.cdn.test", "10.9.0.0/16"}}});
  EXPECT_TRUE(rule_for_name(rules, "a.cdn.test", 443));
  EXPECT_TRUE(rule_for_name(rules, "b.a.cdn.test", 443));
  EXPECT_FALSE(rule_for_name(rules, "cdn.test", 443));
  EXPECT_FALSE(rule_for_name(rules, "xcdn.test", 443));
  EXPECT_FALSE(rule_for_name(rules, "a.cdn.test.evil", 443));
  EXPECT_FALSE(rule_for_name(rules, "a.cdn.test", 80));
  EXPECT_FALSE(rule_for_name(rules, "evil.cdn.test", 443));
  EXPECT_FALSE(name_allowed(rules, "evil.cdn.test"));
  EXPECT_TRUE(rule_for_address(rules, address("10.1.2.3"), 5432));
  EXPECT_FALSE(rule_for_address(rules, address("10.9.2.3"), 5432));
  EXPECT_FALSE(rule_for_address(rules, address("11.1.2.3"), 5432));
  EXPECT_FALSE(rule_for_address(rules, address("10.1.2.3"), 443));
}

// Found by an attack: getaddrinfo reads "3405803788\0.cdn.test" as 203.0.113.12.
TEST(EgressUpstream, OnlyHostNamesAreEverResolved) {
  UpstreamSettings settings;
  settings.resolver = parse_endpoint("127.0.0.1:9");  // asking it would fail differently
  for (const std::string& name :
       {std::string("3405803788"), std::string("3405803788\0.cdn.test", 20), std::string("1.2.3.4"),
        std::string("a b.test"), std::string("")}) {
    std::string why;
    EXPECT_TRUE(resolve(settings, name, -1, why).empty());
    EXPECT_EQ(why, "not a host name") << name;
  }
}

}  // namespace
}  // namespace rlm::egress
