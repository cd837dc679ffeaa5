// JSON -> Policy with validation. Every section is read even after an error elsewhere, so one
// pass reports every problem in the document, each at its JSON path. The filesystem and seccomp
// sections are read in files of their own (filesystem_from_json.cpp, seccomp_from_json.cpp).
#include <algorithm>
#include <span>

#include "policy/kernel_names.hpp"
#include "policy/python_environment.hpp"
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
    "seccomp",     "capabilities", "env",     "user",   "hostname",   "docker",     "python"};
constexpr std::string_view kBackendKeys[] = {"prefer", "allow_unisolated"};
constexpr std::string_view kLimitKeys[] = {
    "wall_time_ms",  "cpu_time_ms",          "memory_bytes", "pids",
    "output_bytes",  "file_size_bytes",      "open_files",   "tmpfs_bytes",
    "kill_grace_ms", "session_buffer_bytes", "cpus"};
constexpr std::string_view kNamespaceKeys[] = {"user", "pid", "net",   "mount",
                                               "ipc",  "uts", "cgroup"};
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
                                 {"docker", kDockerKeys},
                                 {"python", kPythonKeys}};

// Generous enough for any CI job, small enough that deadline arithmetic can never overflow.
constexpr std::chrono::milliseconds kMaxRunTime = 7 * 24h;
constexpr std::chrono::milliseconds kMaxKillGrace = 60s;
constexpr std::uint64_t kMaxId = 4294967294;  // (uid_t)-1 means "unchanged" to the kernel

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
  if (policy.network != Network::host && !policy.namespaces.net)
    reader.error("namespaces.net",
                 "must be true when network is \"none\" or an allowlist: without its own "
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
  if (const json* v = member(document, "network"))
    if (auto network = read_network(reader, *v, "network", policy.egress))
      policy.network = *network;
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
  if (const json* v = member(document, "python")) read_python(reader, *v, "python", policy.python);
  check_consistency(reader, policy);

  auto& found = reader.diagnostics();
  // The Python directories on this host, against the mounts: once both read cleanly.
  const bool python_read_cleanly =
      std::none_of(found.begin(), found.end(), [](const Diagnostic& d) {
        return d.path.rfind("python", 0) == 0 || d.path.rfind("filesystem", 0) == 0;
      });
  if (python_read_cleanly) check_python(policy, found);
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
