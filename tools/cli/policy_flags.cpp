#include "policy_flags.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "rlm_sandbox/units.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

std::string absolute_target(const std::string& flag, const std::string& value,
                            const std::string& target) {
  if (target.empty() || target.front() != '/')
    throw BadFlagValue(flag + " " + value + ": the path inside the sandbox must be absolute");
  if (target.find(':') != std::string::npos)
    throw BadFlagValue(flag + " " + value + ": a ':' is left in the path inside the sandbox");
  return target;
}

// --bind SRC[:DST][:ro|rw], --bind-ro SRC[:DST] and -v SRC[:DST][:ro|rw]: SRC is a host path
// (relative to here), DST defaults to SRC's absolute form; a third field is docker's mode.
MountFlag bind_flag(const std::string& flag, const std::string& value, bool readonly) {
  const std::string shown = flag + " " + value;
  std::vector<std::string> fields;
  for (std::size_t start = 0;;) {
    const auto colon = value.find(':', start);
    fields.push_back(value.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  // SRC:ro names the mode, not a target ("ro" is not an absolute path).
  if (fields.size() == 2 && (fields[1] == "ro" || fields[1] == "rw"))
    fields.insert(fields.begin() + 1, "");
  if (fields.size() > 3)
    throw BadFlagValue(shown + ": expected SRC[:DST][:ro|rw]; a path with ':' in it cannot be " +
                       "named on the command line (a policy file's filesystem.mounts can)");
  if (fields.size() == 3) {
    if (fields[2] != "ro" && fields[2] != "rw")
      throw BadFlagValue(shown + ": unknown mode '" + fields[2] + "'; use ro or rw");
    if (flag == "--bind-ro" && fields[2] == "rw")
      throw BadFlagValue(shown + ": --bind-ro is read-only; use --bind for :rw");
    readonly = fields[2] == "ro";
  }
  const std::string& source = fields[0];
  std::error_code ec;
  auto absolute = std::filesystem::absolute(source, ec).lexically_normal().string();
  if (source.empty() || ec) throw BadFlagValue(shown + ": no source path");
  if (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
  if (!std::filesystem::exists(absolute, ec))
    throw Error(shown + ": " + absolute + " does not exist on this host");
  const std::string target = fields.size() == 1 || fields[1].empty() ? absolute : fields[1];
  return {absolute, absolute_target(flag, value, target), Mount::Type::bind, readonly, {}, shown};
}

// --tmpfs DST[:SIZE]
MountFlag tmpfs_flag(const std::string& value) {
  auto colon = value.rfind(':');
  std::string target = value.substr(0, colon);
  std::optional<std::uint64_t> size;
  if (colon != std::string::npos) size = size_flag("--tmpfs " + value, value.substr(colon + 1));
  return {"",
          absolute_target("--tmpfs", value, target),
          Mount::Type::tmpfs,
          false,
          size,
          "--tmpfs " + value};
}

// NAME=VALUE, or NAME alone for this process's value (left out when it has none), as docker's -e.
void add_env(const std::string& shown, const std::string& entry,
             std::map<std::string, std::string>& env) {
  const auto equals = entry.find('=');
  const std::string name = entry.substr(0, equals);
  if (name.empty()) throw BadFlagValue(shown + ": expected NAME=VALUE or NAME");
  if (equals != std::string::npos) {
    env[name] = entry.substr(equals + 1);
  } else if (const char* value = std::getenv(name.c_str())) {
    env[name] = value;
  }
}

// --env-file FILE: one NAME=VALUE or NAME per line; blank lines and lines starting with # are
// skipped; the value is the rest of the line as it is (no quotes are removed, as docker reads it).
void add_env_file(const std::string& path, std::map<std::string, std::string>& env) {
  std::ifstream file(path);
  if (!file) throw Error("--env-file " + path + ": " + std::strerror(errno));
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    add_env("--env-file " + path + " line " + std::to_string(number), line.substr(first), env);
  }
}

// True when `inner` is `outer` or lies below it.
bool within(const std::string& inner, const std::string& outer) {
  if (outer == "/") return true;
  return inner == outer || (inner.rfind(outer, 0) == 0 && inner[outer.size()] == '/');
}

// Mounts apply in the order given, so one given later at a parent of an earlier one's target
// would hide it: said in the flags' own words.
void check_mount_order(const std::vector<MountFlag>& mounts) {
  for (std::size_t earlier = 0; earlier < mounts.size(); ++earlier)
    for (std::size_t later = earlier + 1; later < mounts.size(); ++later)
      if (mounts[earlier].target != mounts[later].target &&
          within(mounts[earlier].target, mounts[later].target))
        throw BadFlagValue(mounts[earlier].shown + " lies inside " + mounts[later].shown +
                           ", given after it, which would hide it: mounts apply in the order "
                           "given, so give " +
                           mounts[later].shown + " first");
}

}  // namespace

void add_mount_and_env_options(po::options_description& options) {
  options.add_options()  //
      ("bind", po::value<std::vector<std::string>>()->composing(),
       "SRC[:DST][:ro|rw] bind a host path, read-write unless :ro (repeatable; in order)")  //
      ("bind-ro", po::value<std::vector<std::string>>()->composing(),
       "SRC[:DST] bind a host path read-only (repeatable; in order)")  //
      ("volume,v", po::value<std::vector<std::string>>()->composing(),
       "SRC[:DST][:ro|rw] docker's -v: the same as --bind")  //
      ("tmpfs", po::value<std::vector<std::string>>()->composing(),
       "DST[:SIZE] a fresh tmpfs at DST (repeatable; in order)")  //
      ("env,e", po::value<std::vector<std::string>>()->composing(),
       "K=V set an environment variable for the payload, or K alone to pass on this process's "
       "value (repeatable)")  //
      ("env-file", po::value<std::vector<std::string>>()->composing(),
       "FILE of K=V (or K) lines, as --env; # comments and blank lines skipped (repeatable)");
}

// The mount flags as they were written, each converted: the order is the mount order.
std::vector<MountFlag> mount_flags(const std::vector<po::option>& in_order) {
  std::vector<MountFlag> mounts;
  for (const auto& option : in_order)
    for (const auto& value : option.value) {
      if (option.string_key == "bind") mounts.push_back(bind_flag("--bind", value, false));
      if (option.string_key == "volume") mounts.push_back(bind_flag("-v", value, false));
      if (option.string_key == "bind-ro") mounts.push_back(bind_flag("--bind-ro", value, true));
      if (option.string_key == "tmpfs") mounts.push_back(tmpfs_flag(value));
    }
  check_mount_order(mounts);
  return mounts;
}

// Whether a flag changes the policy itself (beside the limits).
bool changes_policy(const std::vector<MountFlag>& mounts, const po::variables_map& values) {
  return !mounts.empty() || values.count("workdir") || values.count("image") ||
         values.count("hostname") || values.count("network") || values.count("allow-net");
}

std::string name_mount_flags(std::string detail, const Policy& policy,
                             const std::vector<MountFlag>& mounts) {
  const auto& list = policy.filesystem.mounts;
  for (const auto& flag : mounts)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].target != flag.target) continue;
      const std::string path = "filesystem.mounts[" + std::to_string(i) + "]";
      const std::string named = path + " (" + flag.shown + ")";
      for (auto at = detail.find(path); at != std::string::npos;
           at = detail.find(path, at + named.size())) {
        if (detail.compare(at, named.size(), named) == 0) continue;
        detail.insert(at + path.size(), " (" + flag.shown + ")");
      }
    }
  return detail;
}

// Flags that change the policy itself (mounts, workdir, image, hostname, network) are applied to
// a copy and the result validated again, so a flag can never produce a policy the loader would
// reject.
Policy apply_policy_flags(Policy policy, const std::vector<MountFlag>& mounts,
                          const po::variables_map& values) {
  for (const auto& flag : mounts) {
    // The policy's rule for kernel interfaces holds for flags too; said here, the message names
    // the flag rather than a position in the merged mount list.
    if (flag.type == Mount::Type::bind && !policy.filesystem.allow_kernel_interface_binds)
      if (auto reason = kernel_interface_in(flag.source))
        throw Error(flag.shown + ": " + flag.source + " " + *reason +
                    "; the policy must set filesystem.allow_kernel_interface_binds to bind it");
    auto& list = policy.filesystem.mounts;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Mount& m) { return m.target == flag.target; }),
               list.end());
    Mount mount;
    mount.source = flag.source;
    mount.target = flag.target;
    mount.type = flag.type;
    mount.readonly = flag.readonly;
    mount.size_bytes = flag.size;
    list.push_back(mount);
  }
  if (values.count("workdir")) {
    auto workdir = values["workdir"].as<std::string>();
    if (workdir.empty() || workdir.front() != '/')
      throw Error("--workdir " + workdir + ": must be an absolute path inside the sandbox");
    policy.filesystem.workdir = workdir;
  }
  if (values.count("image")) policy.docker.image = values["image"].as<std::string>();
  if (values.count("hostname")) policy.hostname = values["hostname"].as<std::string>();
  if (values.count("network")) {
    const auto network = values["network"].as<std::string>();
    if (network == "host" && policy.network != Network::host)
      throw Error("--network host: the policy's network is " +
                  std::string(to_string(policy.network)) + "; a run may only tighten its policy");
    if (network == "none" && policy.network == Network::host)
      policy.namespaces.net = true;  // a network of its own: only loopback
    policy.network = network == "host" ? Network::host : Network::none;
  }
  if (values.count("allow-net")) {
    if (values.count("network") && values["network"].as<std::string>() == "none")
      throw BadFlagValue("--allow-net cannot be given with --network none");
    try {
      policy =
          narrow_network(std::move(policy), values["allow-net"].as<std::vector<std::string>>());
    } catch (const PolicyError& error) {
      std::string message;
      for (const auto& d : error.diagnostics())
        message += (message.empty() ? "" : "; ") + d.message;
      throw BadFlagValue("--allow-net " + message);
    }
  }
  if (!changes_policy(mounts, values)) return policy;
  Policy checked = policy_from_json(policy.to_json(), policy.name + " with command-line flags");
  checked.name = policy.name;
  return checked;
}

void add_env_flags(const po::variables_map& values, std::map<std::string, std::string>& env) {
  // --env-file first, then --env: a flag given on the command line wins over a file's line.
  if (values.count("env-file"))
    for (const auto& path : values["env-file"].as<std::vector<std::string>>())
      add_env_file(path, env);
  if (values.count("env"))
    for (const auto& pair : values["env"].as<std::vector<std::string>>())
      add_env("--env " + pair, pair, env);
}

void check_choice(const std::string& flag, const std::string& value,
                  std::initializer_list<const char*> choices) {
  std::string listed;
  for (const char* choice : choices) {
    if (value == choice) return;
    listed += (listed.empty() ? "" : ", ") + std::string(choice);
  }
  throw BadFlagValue(flag + " '" + value + "': choose one of " + listed);
}

}  // namespace rlm::cli
