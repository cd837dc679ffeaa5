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
#include <memory>
#include <set>

#include "host/unique_fd.hpp"
#include "policy/beneath.hpp"
#include "policy/did_you_mean.hpp"
#include "policy/json_reader.hpp"
#include "policy/json_text.hpp"
#include "policy/read_policy.hpp"
#include "policy/shipped.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::size_t kMaxExtendsDepth = 16;
// Policies are a few kilobytes; the cap keeps a mistaken path such as /dev/zero from hanging us.
constexpr std::size_t kMaxPolicyFileBytes = 1 << 20;

using SharedFd = std::shared_ptr<const host::UniqueFd>;

// One policy document and where it came from.
struct Source {
  std::string text;
  std::string origin;    // how messages name it: a shipped name or a file path
  std::string identity;  // what "the same policy" means for cycles: "shipped:NAME" or a file's id
  // The directory a relative "extends" path starts in, and which it may not leave, as messages
  // name it; none for a shipped policy, whose "extends" is always a name and must never pick up a
  // file that happens to be in the current directory.
  std::optional<std::string> base_dir;
  // That directory, held open: "extends" paths are opened beneath it (never through "..", an
  // absolute path or a symlink leading out), so a policy from a repository reads only files of
  // its own directory. Empty when it could not be opened (base_dir_error says why).
  SharedFd dir;
  std::string base_dir_error;
};

// A Source, or why there is none.
struct Located {
  std::optional<Source> source;
  std::string error;
};

std::string file_identity(int fd) {
  struct stat info;
  if (::fstat(fd, &info) != 0) return "";
  return "file:" + std::to_string(info.st_dev) + ":" + std::to_string(info.st_ino);
}

// The whole of an open file, at most kMaxPolicyFileBytes; or why not.
std::optional<std::string> read_all(int fd, std::string& error) {
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t count = ::read(fd, buffer, sizeof buffer);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) {
      error = std::strerror(errno);
      return std::nullopt;
    }
    if (count == 0) return text;
    text.append(buffer, static_cast<std::size_t>(count));
    if (text.size() > kMaxPolicyFileBytes) {
      error = "larger than 1M; a policy file is a few kilobytes";
      return std::nullopt;
    }
  }
}

// `directory` opened as the base of the extends it holds (directories named on the command line
// or by $RLM_SANDBOX_POLICY_PATH are the caller's own choice, so they are opened as given).
void open_base_dir(Source& source, const std::string& directory) {
  source.base_dir = directory;
  host::UniqueFd fd(::open(directory.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    source.base_dir_error =
        "cannot open the policy's directory '" + directory + "': " + std::strerror(errno);
    return;
  }
  source.dir = std::make_shared<const host::UniqueFd>(std::move(fd));
}

// A file the caller named (on the command line, or found on $RLM_SANDBOX_POLICY_PATH).
Located read_policy_file(const fs::path& path) {
  const std::string shown = path.string();
  const auto failure = [&](const std::string& reason) {
    return Located{std::nullopt, "cannot read policy file '" + shown + "': " + reason};
  };
  host::UniqueFd fd(::open(shown.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return failure(std::strerror(errno));
  std::string error;
  auto text = read_all(fd.get(), error);
  if (!text) return failure(error);
  Source source{std::move(*text), shown, file_identity(fd.get()), std::nullopt, nullptr, ""};
  const fs::path parent = path.parent_path();
  open_base_dir(source, parent.empty() ? "." : parent.string());
  return {std::move(source), ""};
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
// called "strict" are paths. For the command line, "existing" is relative to the current
// directory; for an "extends", it is an entry of the including policy's directory (a symlink
// counts: it is a path, and refused if it leads out).
bool is_path_reference(std::string_view reference, const Source* including) {
  if (reference.find('/') != std::string_view::npos || reference.ends_with(".json") ||
      reference == "." || reference == "..")
    return true;
  if (!including) return is_existing_file(fs::path(reference));
  if (!including->dir) return false;
  struct stat info;
  return ::fstatat(including->dir->get(), std::string(reference).c_str(), &info,
                   AT_SYMLINK_NOFOLLOW) == 0 &&
         !S_ISDIR(info.st_mode);
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
  message += "; shipped policies: " + sys::join(shipped_policy_names(), ", ");
  if (!directories.empty()) message += " (also searched $RLM_SANDBOX_POLICY_PATH)";
  message += "; a file path must contain '/' or end in .json";
  return message;
}

// A policy name: $RLM_SANDBOX_POLICY_PATH first, then the shipped policies.
Located locate_name(const std::string& name) {
  const auto directories = search_path_directories();
  for (const auto& directory : directories) {
    const fs::path candidate = fs::path(directory) / (name + ".json");
    if (is_existing_file(candidate)) return read_policy_file(candidate);
  }
  for (const auto& shipped : policy::shipped_policies())
    if (shipped.name == name)
      return {Source{std::string(shipped.text), name, "shipped:" + name, std::nullopt, nullptr, ""},
              ""};
  return {std::nullopt, unknown_name_message(name, directories)};
}

// The policy the command line (or a program) names: a path as given, or a name.
Located locate(std::string_view reference) {
  if (reference.empty()) return {std::nullopt, "no policy given: expected a name or a file path"};
  if (is_path_reference(reference, nullptr)) return read_policy_file(fs::path(reference));
  return locate_name(std::string(reference));
}

// `reference` as a path inside `directory`, or nullopt when, as written, it is outside it: an
// absolute path elsewhere, or ".." climbing above it. Symlinks are left to open_beneath.
std::optional<fs::path> inside(std::string_view reference, const std::string& directory) {
  fs::path path(reference);
  if (path.is_absolute()) {
    std::error_code error;
    const fs::path base = fs::absolute(directory, error).lexically_normal();
    if (error) return std::nullopt;
    path = path.lexically_normal().lexically_relative(base);
    if (path.empty()) return std::nullopt;
  }
  int depth = 0;
  for (const auto& part : path) {
    if (part == "..")
      --depth;
    else if (part != "." && !part.empty())
      ++depth;
    if (depth < 0) return std::nullopt;
  }
  if (depth == 0) return std::nullopt;  // the directory itself
  return path;
}

// The file an "extends" path names, opened beneath the including policy's directory.
Located locate_beneath(std::string_view reference, const Source& including) {
  const std::string shown = relative_to(reference, including.base_dir).string();
  const auto failure = [&](const std::string& reason) {
    return Located{std::nullopt, "cannot read policy file '" + shown + "': " + reason};
  };
  if (!including.base_dir)
    return {std::nullopt, "'" + std::string(reference) + "': a shipped policy extends only names"};
  const auto outside = [&](std::string_view how) {
    return Located{std::nullopt,
                   "'" + std::string(reference) + "' " + std::string(how) +
                       " outside the policy's directory (" + *including.base_dir +
                       "); extends takes a shipped policy name or a path inside the directory "
                       "of the policy that names it"};
  };
  const auto relative = inside(reference, *including.base_dir);
  if (!relative) return outside("is");
  if (!including.dir) return failure(including.base_dir_error);
  host::UniqueFd fd = policy::open_beneath(including.dir->get(), relative->string(),
                                           O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!fd) {
    if (errno == EXDEV || errno == ELOOP) return outside("leads through a symbolic link");
    if (errno == ENOSYS)
      return failure("this kernel cannot open it safely (openat2 needs Linux 5.6 or later)");
    return failure(std::strerror(errno));
  }
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) return failure(std::strerror(errno));
  // A FIFO would wait for a writer; a device could be anything.
  if (!S_ISREG(info.st_mode)) return failure("not a regular file");
  std::string error;
  auto text = read_all(fd.get(), error);
  if (!text) return failure(error);

  Source source{std::move(*text), shown, file_identity(fd.get()), std::nullopt, nullptr, ""};
  const fs::path parent = fs::path(shown).parent_path();
  source.base_dir = parent.empty() ? "." : parent.string();
  const fs::path relative_parent = relative->parent_path();
  if (relative_parent.empty()) {
    source.dir = including.dir;
  } else if (auto dir = policy::open_beneath(including.dir->get(), relative_parent.string(),
                                             O_PATH | O_DIRECTORY)) {
    source.dir = std::make_shared<const host::UniqueFd>(std::move(dir));
  } else {
    source.base_dir_error =
        "cannot open the policy's directory '" + *source.base_dir + "': " + std::strerror(errno);
  }
  return {std::move(source), ""};
}

// The base an "extends" names: a path inside the including policy's directory, or a name.
Located locate_extends(std::string_view reference, const Source& including) {
  if (reference.empty()) return {std::nullopt, "no policy given: expected a name or a file path"};
  if (is_path_reference(reference, &including)) return locate_beneath(reference, including);
  return locate_name(std::string(reference));
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

Resolved resolve(const Source& source, std::vector<ChainLink>& chain, std::size_t depth);

// filesystem.add_mounts: mounts after the ones the document has once merged over its base, so a
// policy that extends another adds binds without repeating the base's list (filesystem.mounts
// replaces it, as every array does). Folded level by level: each document's additions go after
// everything its base ended with.
void fold_added_mounts(Resolved& resolved) {
  if (!resolved.document) return;
  const auto filesystem = resolved.document->find("filesystem");
  if (filesystem == resolved.document->end() || !filesystem->is_object()) return;
  const auto added = filesystem->find("add_mounts");
  if (added == filesystem->end()) return;
  if (!added->is_array()) {
    resolved.diagnostics.push_back(
        {"filesystem.add_mounts",
         "expected an array of mounts (as filesystem.mounts), got " + policy::describe(*added)});
    filesystem->erase(added);
    return;
  }
  json& mounts = (*filesystem)["mounts"];
  if (mounts.is_null()) mounts = json::array();
  if (mounts.is_array())  // else the parser reports filesystem.mounts itself
    for (const auto& mount : *added) mounts.push_back(mount);
  filesystem->erase("add_mounts");
}

Resolved resolve_level(const Source& source, std::vector<ChainLink>& chain, std::size_t depth) {
  auto parsed = policy::parse_json_text(source.text);
  Resolved result{std::nullopt, std::move(parsed.diagnostics)};
  if (!parsed.document) return result;
  json document = std::move(*parsed.document);
  if (!document.is_object()) {
    result.diagnostics.push_back(
        {"", "a policy must be a JSON object, got " + policy::describe_type(document)});
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
  // A NUL would cut the path the kernel sees short of the one checked here.
  if (reference.get_ref<const std::string&>().find('\0') != std::string::npos)
    return fail("must not contain a NUL character");
  auto base = locate_extends(reference.get<std::string>(), source);
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

Resolved resolve(const Source& source, std::vector<ChainLink>& chain, std::size_t depth) {
  Resolved result = resolve_level(source, chain, depth);
  fold_added_mounts(result);
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
  auto located = locate(name_or_path);
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
  Source source{std::string(json_text), origin, "", std::nullopt, nullptr, ""};
  open_base_dir(source, base_dir);
  auto loaded = load(source, origin);
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
