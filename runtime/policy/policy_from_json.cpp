// JSON -> Policy with validation. Every section is read even after an error elsewhere, so one
// pass reports every problem in the document, each at its JSON path.
#include <algorithm>
#include <map>
#include <span>

#include "policy/did_you_mean.hpp"
#include "policy/json_reader.hpp"
#include "policy/json_text.hpp"
#include "policy/kernel_interface.hpp"
#include "policy/kernel_names.hpp"
#include "policy/read_policy.hpp"
#include "rlm_sandbox/policy.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm {
namespace policy {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::string_view kTopKeys[] = {
    "description", "extends",      "backend", "limits", "namespaces", "filesystem", "network",
    "seccomp",     "capabilities", "env",     "user",   "hostname",   "docker"};
constexpr std::string_view kBackendKeys[] = {"prefer", "allow_unisolated"};
constexpr std::string_view kLimitKeys[] = {
    "wall_time_ms",  "cpu_time_ms",          "memory_bytes", "pids",
    "output_bytes",  "file_size_bytes",      "open_files",   "tmpfs_bytes",
    "kill_grace_ms", "session_buffer_bytes", "cpus"};
constexpr std::string_view kNamespaceKeys[] = {"user", "pid", "net",   "mount",
                                               "ipc",  "uts", "cgroup"};
constexpr std::string_view kFilesystemKeys[] = {"mounts", "workdir",
                                                "allow_kernel_interface_binds"};
constexpr std::string_view kMountKeys[] = {"source",   "target", "type",
                                           "readonly", "size",   "optional"};
constexpr std::string_view kSeccompKeys[] = {"defaultAction", "syscalls"};
constexpr std::string_view kRuleKeys[] = {"names", "action", "errnoRet", "args", "comment"};
constexpr std::string_view kArgKeys[] = {"index", "value", "valueTwo", "op"};
constexpr std::string_view kEnvKeys[] = {"clear", "set", "pass"};
constexpr std::string_view kUserKeys[] = {"uid", "gid"};
constexpr std::string_view kDockerKeys[] = {"image"};

struct Section {
  std::string_view name;
  std::span<const std::string_view> keys;
};
constexpr Section kSections[] = {{"backend", kBackendKeys},
                                 {"limits", kLimitKeys},
                                 {"namespaces", kNamespaceKeys},
                                 {"filesystem", kFilesystemKeys},
                                 {"seccomp", kSeccompKeys},
                                 {"env", kEnvKeys},
                                 {"user", kUserKeys},
                                 {"docker", kDockerKeys}};

// Generous enough for any CI job, small enough that deadline arithmetic can never overflow.
constexpr std::chrono::milliseconds kMaxRunTime = 7 * 24h;
constexpr std::chrono::milliseconds kMaxKillGrace = 60s;
constexpr std::uint64_t kMaxId = 4294967294;  // (uid_t)-1 means "unchanged" to the kernel
constexpr int kMaxErrno = 4095;               // the kernel's MAX_ERRNO

// A key written at the top level that belongs in a section: "memory_bytes" ->
// "limits.memory_bytes".
std::optional<std::string> misplaced_key(std::string_view key) {
  std::optional<std::string> best;
  std::size_t best_distance = typo_allowance(key) + 1;
  for (const auto& section : kSections) {
    for (auto leaf : section.keys) {
      const std::size_t gap =
          leaf.size() > key.size() ? leaf.size() - key.size() : key.size() - leaf.size();
      if (gap >= best_distance) continue;  // cannot be closer: the distance is at least the gap
      if (const auto distance = edit_distance(key, leaf); distance < best_distance) {
        best_distance = distance;
        best = std::string(section.name) + "." + std::string(leaf);
      }
    }
  }
  return best;
}

const json* member(const json& object, std::string_view key) {
  const auto found = object.find(std::string(key));
  return found == object.end() ? nullptr : &*found;
}

// Calls read(value, path) for object[key] when present, and stores what it returns.
template <typename Read, typename Target>
void read_member(const json& object, const std::string& path, std::string_view key, Read read,
                 Target& target) {
  if (const json* value = member(object, key))
    if (auto result = read(*value, key_path(path, key))) target = static_cast<Target>(*result);
}

std::string as_json_string(std::string_view text) {
  return json(std::string(text)).dump();
}

// Lexical normal form of an absolute path: no empty, "." components or trailing slash.
std::string normalized(std::string_view path) {
  std::string result;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (!part.empty() && part != ".") result += "/" + std::string(part);
    start = end + 1;
  }
  return result.empty() ? "/" : result;
}

bool has_dot_dot(std::string_view path) {
  return path == ".." || path.starts_with("../") || path.ends_with("/..") ||
         path.find("/../") != std::string_view::npos;
}

// Checks a path inside the sandbox: absolute, without "..", already in normal form.
bool check_sandbox_path(JsonReader& reader, const std::string& path, const std::string& value) {
  if (!value.starts_with('/')) {
    reader.error(path, "must be an absolute path, got " + as_json_string(value));
    return false;
  }
  if (has_dot_dot(value)) {
    reader.error(path, "must not contain '..', got " + as_json_string(value));
    return false;
  }
  if (const auto normal = normalized(value); normal != value) {
    reader.error(path, "must be written in normal form: " + as_json_string(normal) + ", not " +
                           as_json_string(value));
    return false;
  }
  return true;
}

// `text` when it is one of `choices`; otherwise reports it with a did-you-mean.
template <typename Choices>
std::optional<std::string> check_choice(JsonReader& reader, const std::string& text,
                                        const std::string& path, const Choices& choices) {
  if (std::find(std::begin(choices), std::end(choices), text) != std::end(choices)) return text;
  std::string message = "unknown value " + as_json_string(text);
  if (auto suggestion = closest_match(text, choices)) {
    message += "; did you mean " + *suggestion + "?";
  } else {
    message += "; expected one of:";
    for (const auto& choice : choices) message += " " + std::string(choice);
  }
  reader.error(path, message);
  return std::nullopt;
}

template <typename Choices>
std::optional<std::string> read_choice(JsonReader& reader, const json& value,
                                       const std::string& path, const Choices& choices) {
  auto text = reader.string(value, path);
  if (!text) return std::nullopt;
  return check_choice(reader, *text, path, choices);
}

// An array of strings each checked by `check` (which reports and returns nullopt on a problem,
// or returns the value to store), with duplicates of the stored form reported.
template <typename Check>
std::optional<std::vector<std::string>> read_string_list(JsonReader& reader, const json& value,
                                                         const std::string& path, Check check) {
  if (!reader.array(value, path)) return std::nullopt;
  std::vector<std::string> items;
  std::map<std::string, std::size_t> first_index;
  bool valid = true;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const auto item_path = index_path(path, i);
    auto text = reader.string(value[i], item_path);
    std::optional<std::string> item = text ? check(*text, item_path) : std::nullopt;
    if (!item) {
      valid = false;
      continue;
    }
    if (auto [seen, inserted] = first_index.emplace(*item, i); !inserted) {
      reader.error(item_path, "duplicates " + index_path(path, seen->second) + " (" + *item + ")");
      valid = false;
      continue;
    }
    items.push_back(std::move(*item));
  }
  if (!valid) return std::nullopt;
  return items;
}

// ---- Sections -------------------------------------------------------------------------------

void read_backend(JsonReader& reader, const json& value, const std::string& path,
                  BackendPreference& backend) {
  if (!reader.object(value, path, kBackendKeys)) return;
  const auto known = known_backend_names();
  read_member(
      value, path, "prefer",
      [&](const json& list, const std::string& list_path) {
        auto names = read_string_list(reader, list, list_path,
                                      [&](const std::string& name, const std::string& item_path) {
                                        return check_choice(reader, name, item_path, known);
                                      });
        if (names && names->empty()) {
          reader.error(list_path, "must name at least one backend");
          names.reset();
        }
        return names;
      },
      backend.prefer);
  read_member(
      value, path, "allow_unisolated",
      [&](const json& v, const std::string& p) { return reader.boolean(v, p); },
      backend.allow_unisolated);
}

void read_limits(JsonReader& reader, const json& value, const std::string& path, Limits& limits) {
  if (!reader.object(value, path, kLimitKeys)) return;
  const auto run_time = [&](const json& v, const std::string& p) {
    return reader.duration(v, p, 1ms, kMaxRunTime);
  };
  const auto size = [&](const json& v, const std::string& p) { return reader.size(v, p); };
  read_member(value, path, "wall_time_ms", run_time, limits.wall_time);
  read_member(value, path, "cpu_time_ms", run_time, limits.cpu_time);
  read_member(
      value, path, "kill_grace_ms",
      [&](const json& v, const std::string& p) {
        return reader.duration(v, p, 0ms, kMaxKillGrace);
      },
      limits.kill_grace);
  read_member(value, path, "memory_bytes", size, limits.memory_bytes);
  read_member(value, path, "output_bytes", size, limits.output_bytes);
  read_member(value, path, "file_size_bytes", size, limits.file_size_bytes);
  read_member(value, path, "tmpfs_bytes", size, limits.tmpfs_bytes);
  read_member(value, path, "session_buffer_bytes", size, limits.session_buffer_bytes);
  read_member(
      value, path, "pids",
      [&](const json& v, const std::string& p) {
        return reader.integer(v, p, 1, std::numeric_limits<std::uint32_t>::max());
      },
      limits.pids);
  // Three descriptors are stdin, stdout and stderr; fewer and the payload cannot even start.
  read_member(
      value, path, "open_files",
      [&](const json& v, const std::string& p) {
        return reader.integer(v, p, 3, std::numeric_limits<std::uint32_t>::max());
      },
      limits.open_files);
  // null: no bandwidth limit (a policy may lift the one it extends).
  if (const json* cpus = member(value, "cpus")) {
    if (cpus->is_null())
      limits.cpus.reset();
    else if (auto number = reader.number(*cpus, key_path(path, "cpus"), kMinCpus, kMaxCpus))
      limits.cpus = *number;
  }
}

void read_namespaces(JsonReader& reader, const json& value, const std::string& path,
                     Namespaces& namespaces) {
  if (!reader.object(value, path, kNamespaceKeys)) return;
  const auto flag = [&](const json& v, const std::string& p) { return reader.boolean(v, p); };
  read_member(value, path, "user", flag, namespaces.user);
  read_member(value, path, "pid", flag, namespaces.pid);
  read_member(value, path, "net", flag, namespaces.net);
  read_member(value, path, "mount", flag, namespaces.mount);
  read_member(value, path, "ipc", flag, namespaces.ipc);
  read_member(value, path, "uts", flag, namespaces.uts);
  read_member(value, path, "cgroup", flag, namespaces.cgroup);
}

Mount read_mount(JsonReader& reader, const json& value, const std::string& path) {
  Mount mount;
  if (!reader.object(value, path, kMountKeys)) return mount;

  // An invalid type leaves both false, and the type-specific checks are skipped.
  bool is_bind = true, is_tmpfs = false;
  if (const json* given = member(value, "type")) {
    constexpr std::string_view kTypes[] = {"bind", "tmpfs"};
    auto name = read_choice(reader, *given, key_path(path, "type"), kTypes);
    is_bind = name == "bind";
    is_tmpfs = name == "tmpfs";
  }

  if (const json* target = member(value, "target")) {
    const auto target_path = key_path(path, "target");
    if (auto text = reader.string(*target, target_path)) {
      if (*text == "/")
        reader.error(target_path, "must not be \"/\"; the sandbox root is built by the backend");
      else if (check_sandbox_path(reader, target_path, *text))
        mount.target = *text;
    }
  } else {
    reader.error(key_path(path, "target"), "missing; every mount needs an absolute target path");
  }

  const json* source = member(value, "source");
  const json* size = member(value, "size");
  const json* optional = member(value, "optional");
  if (is_bind) {
    const auto source_path = key_path(path, "source");
    if (!source) {
      reader.error(source_path,
                   "missing; a bind mount needs the absolute host path to bind (or set \"type\": "
                   "\"tmpfs\")");
    } else if (auto text = reader.string(*source, source_path)) {
      if (!text->starts_with('/'))
        reader.error(source_path, "must be an absolute host path, got " + as_json_string(*text));
      else
        mount.source = *text;
    }
    if (size) reader.error(key_path(path, "size"), "only a tmpfs mount takes a size");
    read_member(
        value, path, "optional",
        [&](const json& v, const std::string& p) { return reader.boolean(v, p); }, mount.optional);
  } else if (is_tmpfs) {
    mount.type = Mount::Type::tmpfs;
    mount.readonly = false;
    if (source) reader.error(key_path(path, "source"), "a tmpfs mount takes no source");
    if (optional) reader.error(key_path(path, "optional"), "only a bind mount can be optional");
    read_member(
        value, path, "size", [&](const json& v, const std::string& p) { return reader.size(v, p); },
        mount.size_bytes);
  }
  read_member(
      value, path, "readonly",
      [&](const json& v, const std::string& p) { return reader.boolean(v, p); }, mount.readonly);
  return mount;
}

// Two mounts on one target, or one mounted beneath another that is mounted after it (and would
// hide it), are mistakes the backend could only make silently.
void check_mount_order(JsonReader& reader, const std::vector<Mount>& mounts,
                       const std::string& path) {
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    if (mounts[i].target.empty()) continue;
    for (std::size_t j = 0; j < mounts.size(); ++j) {
      if (i == j || mounts[j].target.empty()) continue;
      const auto target_path = key_path(index_path(path, i), "target");
      if (j < i && mounts[j].target == mounts[i].target) {
        reader.error(target_path, "duplicates " + key_path(index_path(path, j), "target") + " (" +
                                      mounts[i].target + ")");
        break;
      }
      if (j > i && mounts[i].target.starts_with(mounts[j].target + "/")) {
        reader.error(target_path, "lies inside " + index_path(path, j) + " (" + mounts[j].target +
                                      "), which is mounted after it and would hide it; list it "
                                      "after that mount");
        break;
      }
    }
  }
}

// A bind of /proc, /sys, /dev (or anything that is or holds a kernel interface) hands the sandbox
// the host's kernel; a policy does that only when it says so in the field named for the danger.
void check_kernel_interface_binds(JsonReader& reader, const std::vector<Mount>& mounts,
                                  const std::string& path) {
  std::optional<KernelInterfaces> interfaces;  // the mount table, read once and only if needed
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    if (mounts[i].type != Mount::Type::bind || mounts[i].source.empty()) continue;
    if (!interfaces) interfaces.emplace();
    if (auto reason = interfaces->in(mounts[i].source))
      reader.error(key_path(index_path(path, i), "source"),
                   mounts[i].source + " " + *reason +
                       ": binding it hands the sandbox the host's kernel interfaces; set "
                       "filesystem.allow_kernel_interface_binds to true if that is intended");
  }
}

void read_filesystem(JsonReader& reader, const json& value, const std::string& path,
                     Filesystem& filesystem) {
  if (!reader.object(value, path, kFilesystemKeys)) return;
  read_member(
      value, path, "allow_kernel_interface_binds",
      [&](const json& v, const std::string& p) { return reader.boolean(v, p); },
      filesystem.allow_kernel_interface_binds);
  if (const json* mounts = member(value, "mounts")) {
    const auto mounts_path = key_path(path, "mounts");
    if (reader.array(*mounts, mounts_path)) {
      filesystem.mounts.clear();
      for (std::size_t i = 0; i < mounts->size(); ++i)
        filesystem.mounts.push_back(read_mount(reader, (*mounts)[i], index_path(mounts_path, i)));
      check_mount_order(reader, filesystem.mounts, mounts_path);
      if (!filesystem.allow_kernel_interface_binds)
        check_kernel_interface_binds(reader, filesystem.mounts, mounts_path);
    }
  }
  read_member(
      value, path, "workdir",
      [&](const json& v, const std::string& p) -> std::optional<std::string> {
        auto text = reader.string(v, p);
        if (!text || text->empty()) return text;
        if (!check_sandbox_path(reader, p, *text)) return std::nullopt;
        return text;
      },
      filesystem.workdir);
}

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

std::optional<std::string> check_capability(JsonReader& reader, const std::string& name,
                                            const std::string& path) {
  if (auto canonical = canonical_capability(name)) return canonical;
  std::string spelled = name;
  for (char& c : spelled) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!spelled.starts_with("CAP_")) spelled = "CAP_" + spelled;
  std::string message = "unknown capability " + as_json_string(name);
  if (auto suggestion = closest_match(spelled, capability_names()))
    message += "; did you mean " + *suggestion + "?";
  reader.error(path, message);
  return std::nullopt;
}

bool check_env_name(JsonReader& reader, const std::string& name, const std::string& path) {
  if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos) {
    reader.error(path,
                 "an environment variable name must be non-empty and contain neither '=' "
                 "nor NUL, got " +
                     as_json_string(name));
    return false;
  }
  return true;
}

void read_env(JsonReader& reader, const json& value, const std::string& path, Environment& env) {
  if (!reader.object(value, path, kEnvKeys)) return;
  read_member(
      value, path, "clear",
      [&](const json& v, const std::string& p) { return reader.boolean(v, p); }, env.clear);
  if (const json* set = member(value, "set")) {
    const auto set_path = key_path(path, "set");
    if (reader.free_form_object(*set, set_path)) {
      env.set.clear();
      for (const auto& [name, text] : set->items()) {
        const auto entry_path = key_path(set_path, name);
        const bool name_ok = check_env_name(reader, name, entry_path);
        auto string = reader.string(text, entry_path);
        if (name_ok && string) env.set[name] = *string;
      }
    }
  }
  read_member(
      value, path, "pass",
      [&](const json& v, const std::string& p) {
        return read_string_list(reader, v, p,
                                [&](const std::string& name,
                                    const std::string& item_path) -> std::optional<std::string> {
                                  if (!check_env_name(reader, name, item_path)) return std::nullopt;
                                  return name;
                                });
      },
      env.pass);
}

void read_user(JsonReader& reader, const json& value, const std::string& path, User& user) {
  if (!reader.object(value, path, kUserKeys)) return;
  const auto id = [&](const json& v, const std::string& p) {
    return reader.integer(v, p, 0, kMaxId);
  };
  read_member(value, path, "uid", id, user.uid);
  read_member(value, path, "gid", id, user.gid);
}

std::optional<std::string> read_hostname(JsonReader& reader, const json& value,
                                         const std::string& path) {
  auto text = reader.string(value, path);
  if (!text) return std::nullopt;
  const bool valid_chars = std::all_of(text->begin(), text->end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
  });
  if (text->empty() || text->size() > 64 || !valid_chars) {
    reader.error(path, "must be 1 to 64 characters of A-Z, a-z, 0-9, '.' and '-', got " +
                           as_json_string(*text));
    return std::nullopt;
  }
  return text;
}

void read_docker(JsonReader& reader, const json& value, const std::string& path,
                 DockerSettings& docker) {
  if (!reader.object(value, path, kDockerKeys)) return;
  read_member(
      value, path, "image",
      [&](const json& v, const std::string& p) -> std::optional<std::string> {
        auto text = reader.string(v, p);
        if (!text) return std::nullopt;
        const bool has_space = std::any_of(text->begin(), text->end(), [](char c) {
          return std::isspace(static_cast<unsigned char>(c));
        });
        if (text->empty() || has_space) {
          reader.error(p, "must be an image reference such as \"python:3.12-slim\", got " +
                              as_json_string(*text));
          return std::nullopt;
        }
        return text;
      },
      docker.image);
}

// Settings that are each valid but contradict one another.
void check_consistency(JsonReader& reader, const Policy& policy) {
  if (policy.network == Network::none && !policy.namespaces.net)
    reader.error("namespaces.net",
                 "must be true when network is \"none\": without its own "
                 "network namespace a sandbox shares the host's network");
  if (policy.network == Network::host && policy.namespaces.net)
    reader.error("namespaces.net",
                 "must be false when network is \"host\": a network namespace "
                 "of its own would cut the sandbox off the host's network");
  const auto& prefer = policy.backend.prefer;
  if (const auto local = std::find(prefer.begin(), prefer.end(), "local");
      local != prefer.end() && !policy.backend.allow_unisolated)
    reader.error(index_path("backend.prefer", static_cast<std::size_t>(local - prefer.begin())),
                 "the local backend gives no isolation and backend.allow_unisolated is false, so "
                 "it could never be chosen; set allow_unisolated to true or remove \"local\"");
}

}  // namespace

Policy read_policy(const json& document, std::string name, std::vector<Diagnostic>& diagnostics) {
  Policy policy;
  policy.name = std::move(name);
  JsonReader reader;
  if (!document.is_object()) {
    diagnostics.push_back({"", "a policy must be a JSON object, got " + describe_type(document)});
    return policy;
  }
  reader.object(document, "", kTopKeys, misplaced_key);
  if (member(document, "extends"))
    reader.error("extends",
                 "must be resolved before validation; load the document with "
                 "load_policy or load_policy_text");
  read_member(
      document, "", "description",
      [&](const json& v, const std::string& p) { return reader.string(v, p); }, policy.description);
  if (const json* v = member(document, "backend"))
    read_backend(reader, *v, "backend", policy.backend);
  if (const json* v = member(document, "limits")) read_limits(reader, *v, "limits", policy.limits);
  if (const json* v = member(document, "namespaces"))
    read_namespaces(reader, *v, "namespaces", policy.namespaces);
  if (const json* v = member(document, "filesystem"))
    read_filesystem(reader, *v, "filesystem", policy.filesystem);
  read_member(
      document, "", "network",
      [&](const json& v, const std::string& p) -> std::optional<Network> {
        constexpr std::string_view kNetworks[] = {"none", "host"};
        auto text = read_choice(reader, v, p, kNetworks);
        if (!text) return std::nullopt;
        return *text == "host" ? Network::host : Network::none;
      },
      policy.network);
  if (const json* v = member(document, "seccomp"))
    read_seccomp(reader, *v, "seccomp", policy.seccomp);
  read_member(
      document, "", "capabilities",
      [&](const json& v, const std::string& p) {
        return read_string_list(reader, v, p,
                                [&](const std::string& name, const std::string& item_path) {
                                  return check_capability(reader, name, item_path);
                                });
      },
      policy.capabilities);
  if (const json* v = member(document, "env")) read_env(reader, *v, "env", policy.env);
  if (const json* v = member(document, "user")) read_user(reader, *v, "user", policy.user);
  read_member(
      document, "", "hostname",
      [&](const json& v, const std::string& p) { return read_hostname(reader, v, p); },
      policy.hostname);
  if (const json* v = member(document, "docker")) read_docker(reader, *v, "docker", policy.docker);
  check_consistency(reader, policy);

  auto& found = reader.diagnostics();
  diagnostics.insert(diagnostics.end(), found.begin(), found.end());
  // Rules that read well can still be uncompilable (ambiguous, or weakening the mandatory
  // preamble); say so now rather than when a backend starts a sandbox.
  const bool seccomp_read_cleanly =
      std::none_of(found.begin(), found.end(),
                   [](const Diagnostic& d) { return d.path.rfind("seccomp", 0) == 0; });
  if (seccomp_read_cleanly) {
    auto rejected = seccomp::check(policy.seccomp);
    diagnostics.insert(diagnostics.end(), rejected.begin(), rejected.end());
  }
  return policy;
}

}  // namespace policy

Policy policy_from_json(const nlohmann::json& document, std::string origin) {
  std::vector<Diagnostic> diagnostics;
  Policy policy = policy::read_policy(document, origin, diagnostics);
  if (!diagnostics.empty()) throw PolicyError(std::move(origin), std::move(diagnostics));
  return policy;
}

}  // namespace rlm
