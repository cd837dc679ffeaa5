// The policy's "filesystem" section: its mounts (binds and tmpfs), their order, the workdir, and
// the refusal to bind the host's kernel interfaces unless the policy says so.
#include "policy/kernel_interface.hpp"
#include "policy/read_policy.hpp"

namespace rlm::policy {
namespace {

using nlohmann::json;

constexpr std::string_view kMountKeys[] = {"source",   "target", "type",
                                           "readonly", "size",   "optional"};

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

Mount read_mount(JsonReader& reader, const json& value, const std::string& path) {
  Mount mount;
  if (!reader.object(value, path, kMountKeys)) return mount;
  const auto flag = [&](const json& v, const std::string& p) { return reader.boolean(v, p); };

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
    read_member(value, path, "optional", flag, mount.optional);
  } else if (is_tmpfs) {
    mount.type = Mount::Type::tmpfs;
    mount.readonly = false;
    if (source) reader.error(key_path(path, "source"), "a tmpfs mount takes no source");
    if (optional) reader.error(key_path(path, "optional"), "only a bind mount can be optional");
    read_member(
        value, path, "size", [&](const json& v, const std::string& p) { return reader.size(v, p); },
        mount.size_bytes);
  }
  read_member(value, path, "readonly", flag, mount.readonly);
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

}  // namespace

void read_filesystem(JsonReader& reader, const json& value, const std::string& path,
                     Filesystem& filesystem) {
  if (!reader.object(value, path, kFilesystemKeys)) return;
  const auto flag = [&](const json& v, const std::string& p) { return reader.boolean(v, p); };
  read_member(value, path, "allow_kernel_interface_binds", flag,
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

}  // namespace rlm::policy
