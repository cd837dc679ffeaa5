// The flags that change a policy or a payload's environment, shared by `run` and `repl`: mounts
// (--bind, --bind-ro, -v, --tmpfs: in the order given, after the policy's), --workdir, --image,
// --hostname, --network, and the environment (--env, --env-file). docs/cli.md has the rules.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "rlm_sandbox/policy.hpp"

namespace rlm::cli {

struct MountFlag {
  std::string source, target;
  Mount::Type type;
  bool readonly;
  std::optional<std::uint64_t> size;
  std::string shown;  // the flag as given, for messages: "--bind /srv/data:/data"
};

// Adds --bind, --bind-ro, -v/--volume, --tmpfs, -e/--env and --env-file to `options`.
void add_mount_and_env_options(boost::program_options::options_description& options);

// The mount flags among `in_order` (the parser's options as written), converted, in their order;
// refused (BadFlagValue) when a later one would hide an earlier one.
std::vector<MountFlag> mount_flags(const std::vector<boost::program_options::option>& in_order);

// Whether the flags in `values` (or `mounts`) change the policy beside its limits.
bool changes_policy(const std::vector<MountFlag>& mounts,
                    const boost::program_options::variables_map& values);

// `policy` with the mounts, --workdir, --image, --hostname and --network of `values` applied and
// validated again, so a flag never makes a policy the loader would reject. Throws Error.
Policy apply_policy_flags(Policy policy, const std::vector<MountFlag>& mounts,
                          const boost::program_options::variables_map& values);

// `detail` (a Result's, from a run of `policy`) with each "filesystem.mounts[N]" that a mount flag
// made followed by that flag as it was given: "filesystem.mounts[9] (--bind out:/out).source: ...".
std::string name_mount_flags(std::string detail, const Policy& policy,
                             const std::vector<MountFlag>& mounts);

// --env NAME=VALUE or NAME (this process's value; left out when it has none), and --env-file
// FILE (such lines; blank ones and # comments skipped), into `env`: files first, then --env.
void add_env_flags(const boost::program_options::variables_map& values,
                   std::map<std::string, std::string>& env);

// Throws BadFlagValue unless `value` is one of `choices`.
void check_choice(const std::string& flag, const std::string& value,
                  std::initializer_list<const char*> choices);

}  // namespace rlm::cli
