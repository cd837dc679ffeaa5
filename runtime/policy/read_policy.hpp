// The validating conversion from a merged JSON document to a Policy, shared by every loader.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/json_reader.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::policy {

// Fills a Policy from `document` (defaults for what it leaves out) and appends every problem to
// `diagnostics`. The Policy is meaningful only when nothing was appended.
Policy read_policy(const nlohmann::json& document, std::string name,
                   std::vector<Diagnostic>& diagnostics);

// The sections read in files of their own (filesystem_from_json.cpp, seccomp_from_json.cpp,
// python_from_json.cpp), with
// the keys each allows. Each reports its problems to `reader` and fills what it read correctly.
inline constexpr std::string_view kFilesystemKeys[] = {"mounts", "workdir",
                                                       "allow_kernel_interface_binds"};
inline constexpr std::string_view kSeccompKeys[] = {"defaultAction", "syscalls"};
inline constexpr std::string_view kPythonKeys[] = {"venv", "site_packages"};
void read_filesystem(JsonReader& reader, const nlohmann::json& value, const std::string& path,
                     Filesystem& filesystem);
void read_seccomp(JsonReader& reader, const nlohmann::json& value, const std::string& path,
                  Seccomp& seccomp);
void read_python(JsonReader& reader, const nlohmann::json& value, const std::string& path,
                 PythonEnvironment& python);
// network_from_json.cpp: "none", "host" or an allowlist (filling `egress`); nullopt when invalid.
std::optional<Network> read_network(JsonReader& reader, const nlohmann::json& value,
                                    const std::string& path, Egress& egress);

}  // namespace rlm::policy
