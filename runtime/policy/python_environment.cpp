#include "policy/python_environment.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <optional>

#include "host/unique_fd.hpp"
#include "policy/kernel_interface.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::policy {
namespace {

// A pyvenv.cfg is a few lines; a bigger one is not a venv's.
constexpr std::size_t kMaxConfigBytes = 64 << 10;

bool is_at_or_below(std::string_view path, std::string_view directory) {
  if (directory == "/") return true;
  return path == directory || (path.starts_with(directory) && path.size() > directory.size() &&
                               path[directory.size()] == '/');
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// Absolute, without empty, "." or ".." components or a trailing '/'.
bool lexically_normal_absolute(const std::string& path) {
  if (!path.starts_with('/') || path.ends_with('/')) return false;
  std::size_t start = 1;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = std::string_view(path).substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::optional<std::string> real_path(const std::string& path) {
  char buffer[PATH_MAX];
  if (!::realpath(path.c_str(), buffer)) return std::nullopt;
  return std::string(buffer);
}

// Who besides root and the runtime's own user could change `dir` (its entries, or through a
// parent, the directory itself): the sandboxes never run as either, so nothing a sandbox wrote
// can end up on another sandbox's sys.path. nullopt when nobody can. `dir` holds no symlink.
std::optional<std::string> changeable_by_others(const std::string& dir) {
  const uid_t own_user = geteuid();
  const gid_t own_group = getegid();
  std::string path = dir;
  for (bool itself = true;; itself = false) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) return path + ": " + sys::errno_text(errno);
    const std::string what = itself ? dir : dir + "'s parent " + path;
    // In a sticky directory (/tmp) only an entry's owner may rename or remove it.
    const bool sticky = !itself && (info.st_mode & S_ISVTX);
    if (info.st_uid != 0 && info.st_uid != own_user)
      return what + " is owned by uid " + std::to_string(info.st_uid);
    if ((info.st_mode & S_IWOTH) && !sticky) return what + " is writable by every user";
    if ((info.st_mode & S_IWGRP) && !sticky && info.st_gid != 0 && info.st_gid != own_group)
      return what + " is writable by group " + std::to_string(info.st_gid);
    if (path == "/") return std::nullopt;
    path = parent_of(path);
  }
}

// pyvenv.cfg's Python version as "X.Y" ("version = 3.11.2", or uv's "version_info = 3.12.1"),
// or nullopt with the reason.
std::optional<std::string> venv_version(const std::string& venv, std::string& why) {
  const std::string config = venv + "/pyvenv.cfg";
  host::UniqueFd fd(::open(config.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat info {};
  if (!fd) {
    why = errno == ENOENT ? "is not a virtual environment (it has no pyvenv.cfg); name its "
                            "site-packages directory in python.site_packages instead"
                          : "cannot read " + config + ": " + sys::errno_text(errno);
    return std::nullopt;
  }
  if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<std::size_t>(info.st_size) > kMaxConfigBytes) {
    why = config + " is not a regular file of at most 64K";
    return std::nullopt;
  }
  std::string text(static_cast<std::size_t>(info.st_size), '\0');
  const ssize_t count = ::pread(fd.get(), text.data(), text.size(), 0);
  if (count < 0) {
    why = "cannot read " + config + ": " + sys::errno_text(errno);
    return std::nullopt;
  }
  text.resize(static_cast<std::size_t>(count));
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const auto equals = line.find('=');
    if (equals == std::string::npos) continue;
    std::string key = line.substr(0, equals);
    std::erase_if(key, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
    if (key != "version" && key != "version_info") continue;
    std::size_t at = line.find_first_not_of(" \t", equals + 1);
    std::string major, minor;
    while (at < line.size() && std::isdigit(static_cast<unsigned char>(line[at])))
      major += line[at++];
    if (at < line.size() && line[at] == '.') ++at;
    while (at < line.size() && std::isdigit(static_cast<unsigned char>(line[at])))
      minor += line[at++];
    if (!major.empty() && !minor.empty() && major.size() <= 3 && minor.size() <= 3)
      return major + "." + minor;
  }
  why = config + " names no Python version (no \"version = X.Y...\" line)";
  return std::nullopt;
}

// One directory as written: absolute, normal, no ':', not a kernel interface, a directory with no
// symlink on its path that nobody else can change. Returns false (with the problem) otherwise.
bool check_directory(const std::string& where, const std::string& path,
                     const KernelInterfaces& kernel, std::vector<Diagnostic>& problems) {
  const auto problem = [&](std::string message) {
    problems.push_back({where, std::move(message)});
    return false;
  };
  if (!path.starts_with('/')) return problem("must be an absolute host path, got \"" + path + "\"");
  if (path == "/") return problem("must not be \"/\": name the directory of the packages");
  if (!lexically_normal_absolute(path))
    return problem(
        "must be a directory written in normal form (no \"//\", \".\", \"..\" or "
        "trailing '/'), got \"" +
        path + "\"");
  if (path.find(':') != std::string::npos)
    return problem(path + " holds a ':', which separates the directories in " +
                   std::string(kSiteDirsVariable));
  if (auto reason = kernel.in(path))
    return problem(path + " " + *reason + ": a Python environment is never a kernel interface");
  const auto real = real_path(path);
  if (!real)
    return problem(
        path + (errno == ENOENT ? " does not exist on the host" : ": " + sys::errno_text(errno)));
  if (*real != path)
    return problem(path + " leads through a symbolic link to " + *real +
                   "; name the directory itself (" + *real +
                   "), so the sandbox sees it where the host has it");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    return problem(path + " is not a directory");
  if (auto who = changeable_by_others(path))
    return problem(*who +
                   ": only root and the runtime's own user may be able to change an exposed Python "
                   "directory and its parents, or what one sandbox writes there could run in the "
                   "next");
  return true;
}

// A venv's site-packages: lib/pythonX.Y/site-packages for the version its pyvenv.cfg names.
std::optional<std::string> venv_site(const std::string& where, const std::string& venv,
                                     std::vector<Diagnostic>& problems) {
  std::string why;
  const auto version = venv_version(venv, why);
  if (!version) {
    problems.push_back({where, venv + " " + why});
    return std::nullopt;
  }
  const std::string site = venv + "/lib/python" + *version + "/site-packages";
  const auto real = real_path(site);
  struct stat info {};
  if (!real || *real != site || ::stat(site.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    problems.push_back({where, venv + " has no directory " + site +
                                   " (its pyvenv.cfg names Python " + *version + ")"});
    return std::nullopt;
  }
  return site;
}

std::string mount_where(std::size_t index) {
  return "filesystem.mounts[" + std::to_string(index) + "]";
}

// The directory against the policy's mounts: none may make it writable, none may be hidden by it,
// and one at the same target must be a read-only bind of the directory itself.
void check_against_mounts(const Policy& policy, PythonDir& dir, std::vector<Diagnostic>& problems) {
  const auto& mounts = policy.filesystem.mounts;
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    const Mount& mount = mounts[i];
    std::optional<std::string> source;
    if (mount.type == Mount::Type::bind) source = real_path(mount.source);
    if (mount.target == dir.path) {
      if (mount.type == Mount::Type::bind && mount.readonly && source == dir.path) {
        dir.bound_by_policy = true;
        continue;
      }
      problems.push_back({dir.where, dir.path + " is also the target of " + mount_where(i) +
                                         ", which is not a read-only bind of it"});
    } else if (is_at_or_below(mount.target, dir.path)) {
      problems.push_back({dir.where, dir.path + " holds " + mount_where(i) + "'s target " +
                                         mount.target + ", which its bind would hide"});
    } else if (source && !mount.readonly &&
               (is_at_or_below(*source, dir.path) || is_at_or_below(dir.path, *source))) {
      problems.push_back({dir.where, mount_where(i) + " binds " + mount.source +
                                         " read-write, so the sandbox could write into " +
                                         dir.path + "; an exposed Python directory is read-only"});
    }
  }
}

}  // namespace

std::vector<PythonDir> check_python(const Policy& policy, std::vector<Diagnostic>& problems) {
  std::vector<PythonDir> dirs;
  const auto& python = policy.python;
  if (!python.venv && python.site_packages.empty()) return dirs;
  const KernelInterfaces kernel;
  if (python.venv) dirs.push_back({"python.venv", *python.venv, {}, false});
  for (std::size_t i = 0; i < python.site_packages.size(); ++i)
    dirs.push_back({"python.site_packages[" + std::to_string(i) + "]", python.site_packages[i],
                    python.site_packages[i], false});
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    auto& dir = dirs[i];
    const auto earlier = std::find_if(dirs.begin(), dirs.begin() + static_cast<std::ptrdiff_t>(i),
                                      [&](const PythonDir& d) { return d.path == dir.path; });
    if (earlier != dirs.begin() + static_cast<std::ptrdiff_t>(i)) {
      problems.push_back({dir.where, "duplicates " + earlier->where + " (" + dir.path + ")"});
      continue;
    }
    if (!check_directory(dir.where, dir.path, kernel, problems)) continue;
    if (i == 0 && python.venv) {
      auto site = venv_site(dir.where, dir.path, problems);
      if (!site) continue;
      dir.site = std::move(*site);
    }
    check_against_mounts(policy, dir, problems);
  }
  return dirs;
}

std::vector<PythonDir> python_dirs(const Policy& policy) {
  std::vector<Diagnostic> problems;
  auto dirs = check_python(policy, problems);
  if (!problems.empty()) {
    std::string message = "the policy's Python environment cannot be exposed:";
    for (const auto& problem : problems) message += "\n  " + problem.to_string();
    throw Error(message);
  }
  return dirs;
}

std::string site_dirs_value(const std::vector<PythonDir>& dirs) {
  std::string value;
  for (const auto& dir : dirs) value += (value.empty() ? "" : ":") + dir.site;
  return value;
}

}  // namespace rlm::policy
