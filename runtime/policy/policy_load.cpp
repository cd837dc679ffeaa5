// Finding policies (files, $RLM_SANDBOX_POLICY_PATH, the shipped ones) and resolving "extends":
// a base document is loaded first and the extending one merged over it, key by key for objects,
// wholesale for everything else. Problems in a base file are reported at "extends", naming the
// file they are in, next to the problems of the document itself.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "policy/did_you_mean.hpp"
#include "policy/json_reader.hpp"
#include "policy/json_text.hpp"
#include "policy/read_policy.hpp"
#include "policy/shipped.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::size_t kMaxExtendsDepth = 16;
// Policies are a few kilobytes; the cap keeps a mistaken path such as /dev/zero from hanging us.
constexpr std::size_t kMaxPolicyFileBytes = 1 << 20;

// One policy document and where it came from.
struct Source {
  std::string text;
  std::string origin;    // how messages name it: a shipped name or a file path
  std::string identity;  // what "the same policy" means for cycles: "shipped:NAME" or a real path
  // Where a relative "extends" path starts; none for a shipped policy, whose "extends" is always
  // a name and must never pick up a file that happens to be in the current directory.
  std::optional<std::string> base_dir;
};

// A Source, or why there is none.
struct Located {
  std::optional<Source> source;
  std::string error;
};

Located read_policy_file(const fs::path& path) {
  const std::string shown = path.string();
  const auto failure = [&](const std::string& reason) {
    return Located{std::nullopt, "cannot read policy file '" + shown + "': " + reason};
  };
  const int fd = ::open(shown.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failure(std::strerror(errno));
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t count = ::read(fd, buffer, sizeof buffer);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) {
      const int error = errno;
      ::close(fd);
      return failure(std::strerror(error));
    }
    if (count == 0) break;
    text.append(buffer, static_cast<std::size_t>(count));
    if (text.size() > kMaxPolicyFileBytes) {
      ::close(fd);
      return failure("larger than 1M; a policy file is a few kilobytes");
    }
  }
  ::close(fd);
  std::error_code ignored;
  const fs::path real = fs::weakly_canonical(path, ignored);
  const fs::path parent = path.parent_path();
  return {Source{std::move(text), shown, real.empty() ? shown : real.string(),
                 parent.empty() ? "." : parent.string()},
          ""};
}

std::vector<std::string> search_path_directories() {
  std::vector<std::string> directories;
  const char* value = std::getenv("RLM_SANDBOX_POLICY_PATH");
  if (!value) return directories;
  std::string_view rest = value;
  for (;;) {
    const std::size_t colon = rest.find(':');
    const auto directory = rest.substr(0, colon);
    if (!directory.empty()) directories.emplace_back(directory);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return directories;
}

bool is_existing_file(const fs::path& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && !S_ISDIR(info.st_mode);
}

// `reference` relative to `base_dir`, spelled the way a user would: "./base.json" from "." stays
// as written, and from "/etc/rlm" becomes "/etc/rlm/base.json".
fs::path relative_to(std::string_view reference, const std::optional<std::string>& base_dir) {
  if (!base_dir || *base_dir == "." || reference.starts_with('/')) return fs::path(reference);
  while (reference.starts_with("./")) reference.remove_prefix(2);
  return fs::path(*base_dir) / reference;
}

// "strict" is a name; "./strict.json", "policies/strict", "strict.json" and an existing file
// called "strict" are paths.
bool is_path_reference(std::string_view reference, const std::optional<std::string>& base_dir) {
  return reference.find('/') != std::string_view::npos || reference.ends_with(".json") ||
         (base_dir && is_existing_file(relative_to(reference, base_dir)));
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::string unknown_name_message(const std::string& name,
                                 const std::vector<std::string>& directories) {
  std::set<std::string> candidates;
  for (const auto& shipped : policy::shipped_policies()) candidates.emplace(shipped.name);
  for (const auto& directory : directories) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(directory, error))
      if (entry.path().extension() == ".json") candidates.insert(entry.path().stem().string());
  }
  std::string message = "unknown policy '" + name + "'";
  if (auto suggestion = policy::closest_match(name, candidates))
    message += "; did you mean " + *suggestion + "?";
  message += "; shipped policies: " + join(shipped_policy_names());
  if (!directories.empty()) message += " (also searched $RLM_SANDBOX_POLICY_PATH)";
  message += "; a file path must contain '/' or end in .json";
  return message;
}

// The policy `reference` names, looked up relative to `base_dir`.
Located locate(std::string_view reference, const std::optional<std::string>& base_dir) {
  if (reference.empty()) return {std::nullopt, "no policy given: expected a name or a file path"};
  if (is_path_reference(reference, base_dir))
    return read_policy_file(relative_to(reference, base_dir));

  const std::string name(reference);
  const auto directories = search_path_directories();
  for (const auto& directory : directories) {
    const fs::path candidate = fs::path(directory) / (name + ".json");
    if (is_existing_file(candidate)) return read_policy_file(candidate);
  }
  for (const auto& shipped : policy::shipped_policies())
    if (shipped.name == name)
      return {Source{std::string(shipped.text), name, "shipped:" + name, std::nullopt}, ""};
  return {std::nullopt, unknown_name_message(name, directories)};
}

// Objects merge key by key, recursively; any other value in `overlay` replaces the base's.
json merged(json base, const json& overlay) {
  if (!base.is_object() || !overlay.is_object()) return overlay;
  for (const auto& [key, value] : overlay.items()) {
    const auto existing = base.find(key);
    if (existing == base.end())
      base[key] = value;
    else
      *existing = merged(std::move(*existing), value);
  }
  return base;
}

struct Resolved {
  std::optional<json> document;  // absent when the text is not a JSON object
  std::vector<Diagnostic> diagnostics;
};

// The chain of documents being resolved, outermost first, for cycle detection and messages.
struct ChainLink {
  std::string identity;
  std::string origin;
};

Resolved resolve(const Source& source, std::vector<ChainLink>& chain, std::size_t depth) {
  auto parsed = policy::parse_json_text(source.text);
  Resolved result{std::nullopt, std::move(parsed.diagnostics)};
  if (!parsed.document) return result;
  json document = std::move(*parsed.document);
  if (!document.is_object()) {
    result.diagnostics.push_back(
        {"", "a policy must be a JSON object, got " + policy::describe(document)});
    return result;
  }
  result.document = std::move(document);
  const auto extends = result.document->find("extends");
  if (extends == result.document->end()) return result;
  const json reference = std::move(*extends);
  result.document->erase(extends);

  const auto fail = [&](std::string message) {
    result.diagnostics.push_back({"extends", std::move(message)});
    return result;  // the document is still validated on its own
  };
  if (!reference.is_string())
    return fail("expected a policy name or file path, got " + policy::describe(reference));
  auto base = locate(reference.get<std::string>(), source.base_dir);
  if (!base.source) return fail(base.error);
  const auto repeated = std::find_if(chain.begin(), chain.end(), [&](const ChainLink& link) {
    return link.identity == base.source->identity;
  });
  if (repeated != chain.end()) {
    std::string cycle;
    for (auto link = repeated; link != chain.end(); ++link) cycle += link->origin + " -> ";
    return fail("cycle: " + cycle + base.source->origin);
  }
  if (depth >= kMaxExtendsDepth)
    return fail("more than " + std::to_string(kMaxExtendsDepth) + " levels of extends");

  chain.push_back({base.source->identity, base.source->origin});
  Resolved parent = resolve(*base.source, chain, depth + 1);
  chain.pop_back();
  for (const auto& problem : parent.diagnostics)
    result.diagnostics.push_back(
        {"extends", "in " + base.source->origin + ": " + problem.to_string()});
  if (parent.document) result.document = merged(std::move(*parent.document), *result.document);
  return result;
}

struct Loaded {
  Policy policy;
  std::vector<Diagnostic> diagnostics;
};

Loaded load(const Source& source, std::string name) {
  std::vector<ChainLink> chain;
  if (!source.identity.empty()) chain.push_back({source.identity, source.origin});
  Resolved resolved = resolve(source, chain, 0);
  Loaded loaded{Policy{}, std::move(resolved.diagnostics)};
  if (resolved.document)
    loaded.policy = policy::read_policy(*resolved.document, std::move(name), loaded.diagnostics);
  return loaded;
}

Loaded load_reference(std::string_view name_or_path) {
  auto located = locate(name_or_path, std::string("."));
  if (!located.source) return {Policy{}, {{"", located.error}}};
  return load(*located.source, std::string(name_or_path));
}

}  // namespace

Policy load_policy(std::string_view name_or_path) {
  auto loaded = load_reference(name_or_path);
  if (!loaded.diagnostics.empty())
    throw PolicyError(std::string(name_or_path), std::move(loaded.diagnostics));
  return std::move(loaded.policy);
}

Policy load_policy_text(std::string_view json_text, std::string origin, std::string base_dir) {
  auto loaded = load(Source{std::string(json_text), origin, "", std::move(base_dir)}, origin);
  if (!loaded.diagnostics.empty())
    throw PolicyError(std::move(origin), std::move(loaded.diagnostics));
  return std::move(loaded.policy);
}

std::vector<Diagnostic> check_policy(std::string_view name_or_path) {
  return load_reference(name_or_path).diagnostics;
}

std::vector<std::string> shipped_policy_names() {
  std::vector<std::string> names;
  for (const auto& shipped : policy::shipped_policies()) names.emplace_back(shipped.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace rlm
