#include "policy/kernel_interface.hpp"

#include <stdlib.h>

#include <algorithm>
#include <climits>
#include <filesystem>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::policy {
namespace {

// The host paths whose contents are the kernel's interfaces rather than files.
constexpr std::string_view kKernelPaths[] = {"/proc", "/sys", "/dev"};

// Filesystems that are interfaces to the kernel wherever they are mounted.
constexpr std::string_view kKernelFilesystems[] = {
    "proc",    "sysfs",       "devtmpfs", "devpts",   "debugfs",  "tracefs",    "securityfs",
    "cgroup",  "cgroup2",     "bpf",      "configfs", "efivarfs", "pstore",     "selinuxfs",
    "smackfs", "binfmt_misc", "fusectl",  "nsfs",     "mqueue",   "rpc_pipefs", "nfsd"};

bool is_kernel_filesystem(std::string_view type) {
  return std::find(std::begin(kKernelFilesystems), std::end(kKernelFilesystems), type) !=
         std::end(kKernelFilesystems);
}

bool is_at_or_below(std::string_view path, std::string_view directory) {
  if (directory == "/") return true;
  return path == directory || (path.starts_with(directory) && path.size() > directory.size() &&
                               path[directory.size()] == '/');
}

// `path` lexically normal, without a trailing '/'.
std::string normal(std::string_view path) {
  std::string text = std::filesystem::path(path).lexically_normal().string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

std::optional<std::string> by_path(const std::string& path) {
  if (path == "/") return "holds the host's /proc, /sys and /dev";
  for (auto kernel : kKernelPaths)
    if (is_at_or_below(path, kernel)) return "is in the host's " + std::string(kernel);
  return std::nullopt;
}

}  // namespace

KernelInterfaces::KernelInterfaces() {
  for (auto& parsed : sys::parse_mountinfo(sys::self_mountinfo().value_or(""))) {
    KernelMount mount{std::move(parsed.mount_point), std::move(parsed.fs_type)};
    if (is_kernel_filesystem(mount.type)) kernel_mounts_.push_back(mount);
    all_mounts_.push_back(std::move(mount));
  }
}

std::optional<std::string> KernelInterfaces::in(std::string_view source) const {
  if (!source.starts_with('/')) return std::nullopt;
  const std::string written = normal(source);
  if (auto reason = by_path(written)) return reason;
  // What the backend will bind: the source with every symlink resolved.
  char buffer[PATH_MAX];
  const std::string source_text(source);
  if (!::realpath(source_text.c_str(), buffer)) return std::nullopt;
  const std::string resolved = buffer;
  if (auto reason = by_path(resolved)) return "resolves to " + resolved + ", which " + *reason;
  // The filesystem it is on: the mount with the longest mount point above it, the last one
  // listed when several share that point (it is on top).
  const KernelMount* on = nullptr;
  for (const auto& mount : all_mounts_)
    if (is_at_or_below(resolved, mount.point) && (!on || mount.point.size() >= on->point.size()))
      on = &mount;
  if (on && is_kernel_filesystem(on->type))
    return "is on a " + on->type + " filesystem (mounted at " + on->point + ")";
  for (const auto& mount : kernel_mounts_)
    if (mount.point != resolved && is_at_or_below(mount.point, resolved))
      return "holds a " + mount.type + " filesystem (mounted at " + mount.point + ")";
  return std::nullopt;
}

}  // namespace rlm::policy

namespace rlm {

std::optional<std::string> kernel_interface_in(std::string_view source) {
  return policy::KernelInterfaces().in(source);
}

}  // namespace rlm
