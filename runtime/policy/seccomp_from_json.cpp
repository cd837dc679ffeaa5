// The policy's "seccomp" section: the default action and the rules, each rule's syscalls (known to
// libseccomp), action, errno and argument comparisons.
#include "policy/kernel_names.hpp"
#include "policy/read_policy.hpp"

namespace rlm::policy {
namespace {

using nlohmann::json;

constexpr std::string_view kRuleKeys[] = {"names", "action", "errnoRet", "args", "comment"};
constexpr std::string_view kArgKeys[] = {"index", "value", "valueTwo", "op"};
constexpr int kMaxErrno = 4095;  // the kernel's MAX_ERRNO

std::optional<SeccompArg> read_seccomp_arg(JsonReader& reader, const json& value,
                                           const std::string& path) {
  if (!reader.object(value, path, kArgKeys)) return std::nullopt;
  SeccompArg arg;
  bool complete = true;
  const auto required = [&](std::string_view key) {
    if (member(value, key)) return true;
    reader.error(key_path(path, key), "missing; every argument comparison needs it");
    complete = false;
    return false;
  };
  const auto u64 = [&](const json& v, const std::string& p) {
    return reader.integer(v, p, 0, std::numeric_limits<std::uint64_t>::max());
  };
  if (required("index"))
    read_member(
        value, path, "index",
        [&](const json& v, const std::string& p) { return reader.integer(v, p, 0, 5); }, arg.index);
  if (required("value")) read_member(value, path, "value", u64, arg.value);
  read_member(value, path, "valueTwo", u64, arg.value_two);
  if (required("op"))
    read_member(
        value, path, "op",
        [&](const json& v, const std::string& p) {
          return read_choice(reader, v, p, kSeccompOperators);
        },
        arg.op);
  if (!complete) return std::nullopt;
  return arg;
}

std::optional<std::string> check_syscall_name(JsonReader& reader, const std::string& name,
                                              const std::string& path) {
  if (is_known_syscall(name)) return name;
  std::string message =
      "unknown syscall " + as_json_string(name) + " (libseccomp does not know it)";
  if (auto suggestion = closest_match(name, native_syscall_names()))
    message += "; did you mean " + *suggestion + "?";
  reader.error(path, message);
  return std::nullopt;
}

SeccompRule read_seccomp_rule(JsonReader& reader, const json& value, const std::string& path) {
  SeccompRule rule;
  if (!reader.object(value, path, kRuleKeys)) return rule;
  const auto names_path = key_path(path, "names");
  if (const json* names = member(value, "names")) {
    auto list = read_string_list(reader, *names, names_path,
                                 [&](const std::string& name, const std::string& item_path) {
                                   return check_syscall_name(reader, name, item_path);
                                 });
    if (list && list->empty()) reader.error(names_path, "must list at least one syscall");
    if (list) rule.names = std::move(*list);
  } else {
    reader.error(names_path, "missing; every rule lists the syscalls it applies to");
  }
  const auto action_path = key_path(path, "action");
  if (const json* action = member(value, "action")) {
    if (auto name = read_choice(reader, *action, action_path, kSeccompActions)) rule.action = *name;
  } else {
    reader.error(action_path, "missing; every rule needs an action such as SCMP_ACT_ERRNO");
  }
  if (const json* errno_ret = member(value, "errnoRet")) {
    const auto errno_path = key_path(path, "errnoRet");
    if (!rule.action.empty() && rule.action != "SCMP_ACT_ERRNO")
      reader.error(errno_path, "only a rule with action SCMP_ACT_ERRNO takes errnoRet");
    else if (auto number = reader.integer(*errno_ret, errno_path, 1, kMaxErrno))
      rule.errno_ret = static_cast<int>(*number);
  }
  if (const json* args = member(value, "args")) {
    const auto args_path = key_path(path, "args");
    if (reader.array(*args, args_path)) {
      for (std::size_t i = 0; i < args->size(); ++i)
        if (auto arg = read_seccomp_arg(reader, (*args)[i], index_path(args_path, i)))
          rule.args.push_back(std::move(*arg));
      if (rule.args.size() > 6) reader.error(args_path, "a syscall has at most 6 arguments");
    }
  }
  if (const json* comment = member(value, "comment"))
    reader.string(*comment, key_path(path, "comment"));
  return rule;
}

}  // namespace

void read_seccomp(JsonReader& reader, const json& value, const std::string& path,
                  Seccomp& seccomp) {
  if (!reader.object(value, path, kSeccompKeys)) return;
  read_member(
      value, path, "defaultAction",
      [&](const json& v, const std::string& p) {
        return read_choice(reader, v, p, kSeccompActions);
      },
      seccomp.default_action);
  if (const json* rules = member(value, "syscalls")) {
    const auto rules_path = key_path(path, "syscalls");
    if (!reader.array(*rules, rules_path)) return;
    seccomp.syscalls.clear();
    for (std::size_t i = 0; i < rules->size(); ++i)
      seccomp.syscalls.push_back(read_seccomp_rule(reader, (*rules)[i], index_path(rules_path, i)));
  }
}

}  // namespace rlm::policy
