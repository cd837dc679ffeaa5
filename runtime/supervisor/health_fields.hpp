// Policy fields as `health` names them (Health::enforced, unenforced, fallbacks: the policy JSON's
// names), where backends share them.
#pragma once

#include <string>
#include <vector>

namespace rlm::supervisor {

// What an isolating backend enforces by the sandbox it builds, whatever its limits and
// namespaces: appended to `fields` in the order health lists them.
inline void append_sandbox_fields(std::vector<std::string>& fields) {
  fields.insert(fields.end(), {"filesystem.mounts", "filesystem.workdir", "network", "seccomp",
                               "capabilities", "env", "user", "hostname", "python"});
}

}  // namespace rlm::supervisor
