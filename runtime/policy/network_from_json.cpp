// "network": "none", "host", or an allowlist object (docs/policy.md, "network").
#include <algorithm>

#include "policy/network_rules.hpp"
#include "policy/read_policy.hpp"

namespace rlm::policy {
namespace {

using nlohmann::json;

std::vector<NetworkRule> read_rules(JsonReader& reader, const json& value, const std::string& path,
                                    bool deny) {
  std::vector<NetworkRule> rules;
  const auto texts = read_string_list(
      reader, value, path, [&](const std::string& text, const std::string& item_path) {
        std::string why;
        auto rule = parse_network_rule(text, deny, why);
        if (!rule) {
          reader.error(item_path, as_json_string(text) + ": " + why);
          return std::optional<std::string>();
        }
        rules.push_back(std::move(*rule));
        return std::optional<std::string>(text);
      });
  (void)texts;  // the valid entries are kept, so later checks against them stay meaningful
  return rules;
}

bool header_name(const std::string& text) {
  // RFC 9110 token characters.
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

bool environment_name(const std::string& text) {
  return !text.empty() && !(text[0] >= '0' && text[0] <= '9') &&
         std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_';
         });
}

constexpr std::string_view kInjectKeys[] = {"host", "header", "value_from_env", "value_from_file"};
constexpr std::string_view kLimitKeys[] = {
    "connections",         "names", "idle_ms", "connection_bytes", "client_hello_bytes",
    "client_hello_wait_ms"};

void read_inject(JsonReader& reader, const json& value, const std::string& path, Egress& egress) {
  if (!reader.array(value, path)) return;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const auto item_path = index_path(path, i);
    const json& item = value[i];
    if (!reader.object(item, item_path, kInjectKeys)) continue;
    NetworkInjection injection;
    bool valid = true;
    if (const json* host = member(item, "host")) {
      const auto text = reader.string(*host, key_path(item_path, "host"));
      std::string why;
      const auto rule = text ? parse_network_rule(*text, false, why) : std::nullopt;
      if (!text) {
        valid = false;
      } else if (!rule || rule->kind != NetworkRule::Kind::name ||
                 rule->first_port != rule->last_port || rule->scheme == NetworkRule::Scheme::http) {
        reader.error(key_path(item_path, "host"),
                     as_json_string(*text) +
                         ": must be one name and one TLS port, such as "
                         "\"api.example.com:443\" or \"https://api.example.com\"" +
                         (rule ? "" : " (" + why + ")"));
        valid = false;
      } else if (!covered_by_any(egress.allow, *rule)) {
        reader.error(key_path(item_path, "host"),
                     as_json_string(*text) + " is not allowed by any entry of network.allow");
        valid = false;
      } else {
        injection.host = rule->name + ":" + std::to_string(rule->first_port);
      }
    } else {
      reader.error(item_path, "needs \"host\"");
      valid = false;
    }
    if (const json* header = member(item, "header")) {
      const auto text = reader.string(*header, key_path(item_path, "header"));
      if (text && header_name(*text)) {
        injection.header = *text;
      } else {
        if (text)
          reader.error(key_path(item_path, "header"),
                       as_json_string(*text) + ": not an HTTP header name");
        valid = false;
      }
    } else {
      reader.error(item_path, "needs \"header\"");
      valid = false;
    }
    const json* from_env = member(item, "value_from_env");
    const json* from_file = member(item, "value_from_file");
    if (!from_env == !from_file) {
      reader.error(item_path,
                   "needs exactly one of \"value_from_env\" and \"value_from_file\": "
                   "the value itself is never written in a policy");
      valid = false;
    } else if (from_env) {
      const auto text = reader.string(*from_env, key_path(item_path, "value_from_env"));
      if (text && environment_name(*text)) {
        injection.value_from_env = *text;
      } else {
        if (text)
          reader.error(key_path(item_path, "value_from_env"),
                       as_json_string(*text) + ": not an environment variable name");
        valid = false;
      }
    } else {
      const auto text = reader.string(*from_file, key_path(item_path, "value_from_file"));
      if (text && !text->empty() && text->front() == '/') {
        injection.value_from_file = *text;
      } else {
        if (text)
          reader.error(key_path(item_path, "value_from_file"), "must be an absolute host path");
        valid = false;
      }
    }
    if (valid) egress.inject.push_back(std::move(injection));
  }
}

void read_limits(JsonReader& reader, const json& value, const std::string& path,
                 EgressLimits& limits) {
  if (!reader.object(value, path, kLimitKeys)) return;
  const auto count = [&](std::string_view key, std::uint64_t min, std::uint64_t max,
                         std::uint32_t& target) {
    if (const json* v = member(value, key))
      if (auto n = reader.integer(*v, key_path(path, key), min, max))
        target = static_cast<std::uint32_t>(*n);
  };
  const auto wait = [&](std::string_view key, std::chrono::milliseconds max,
                        std::chrono::milliseconds& target) {
    if (const json* v = member(value, key))
      if (auto d = reader.duration(*v, key_path(path, key), std::chrono::milliseconds(1), max))
        target = *d;
  };
  count("connections", 1, 4096, limits.connections);
  count("names", 1, 65536, limits.names);
  count("client_hello_bytes", 512, 65536, limits.client_hello_bytes);
  wait("idle_ms", std::chrono::hours(24), limits.idle);
  if (const json* v = member(value, "connection_bytes"))
    if (auto n = reader.size(*v, key_path(path, "connection_bytes"))) limits.connection_bytes = *n;
  wait("client_hello_wait_ms", std::chrono::minutes(1), limits.client_hello_wait);
}

constexpr std::string_view kAllowlistKeys[] = {"allow", "deny", "private", "inject", "limits"};

}  // namespace

std::optional<Network> read_network(JsonReader& reader, const json& value, const std::string& path,
                                    Egress& egress) {
  if (value.is_string()) {
    constexpr std::string_view kNetworks[] = {"none", "host"};
    auto text = read_choice(reader, value, path, kNetworks);
    if (!text) return std::nullopt;
    return *text == "host" ? Network::host : Network::none;
  }
  if (!value.is_object()) {
    reader.error(path,
                 "must be \"none\", \"host\" or an allowlist object "
                 "({\"allow\": [\"pypi.org:443\"]}), got " +
                     describe(value));
    return std::nullopt;
  }
  if (!reader.object(value, path, kAllowlistKeys)) return std::nullopt;
  Egress read;
  const json* allow = member(value, "allow");
  if (!allow) {
    reader.error(path, "an allowlist needs \"allow\" (an empty list is \"none\")");
    return std::nullopt;
  }
  read.allow = read_rules(reader, *allow, key_path(path, "allow"), false);
  if (const json* deny = member(value, "deny"))
    read.deny = read_rules(reader, *deny, key_path(path, "deny"), true);
  if (const json* v = member(value, "private"))
    if (auto b = reader.boolean(*v, key_path(path, "private"))) read.allow_private = *b;
  if (const json* v = member(value, "inject"))
    read_inject(reader, *v, key_path(path, "inject"), read);
  if (const json* v = member(value, "limits"))
    read_limits(reader, *v, key_path(path, "limits"), read.limits);
  // Nothing allowed is no network at all.
  if (allow->is_array() && allow->empty()) return Network::none;
  egress = std::move(read);
  return Network::allowlist;
}

}  // namespace rlm::policy
