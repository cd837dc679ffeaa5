// From a policy to the body of POST /containers/create: the whole mapping of policy fields onto
// Docker's container and host configuration, and the refusal of what Docker cannot honour.
// docs/docker-backend.md has the table.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::docker {

// What the daemon does that the mapping depends on (from GET /info).
struct DaemonTraits {
  bool remaps_users = false;  // userns-remap: container root is an unprivileged host uid
};

// Every policy field Docker cannot honour as written, each at its JSON path; empty when it can
// run the policy. Seccomp rules are checked by compiling the Docker profile.
std::vector<Diagnostic> unsupported_fields(const Policy& policy, const DaemonTraits& daemon);

// Throws Error listing unsupported_fields() when there are any.
void require_supported(const Policy& policy, const DaemonTraits& daemon);

struct ContainerPlan {
  std::vector<std::string> command;      // Cmd; the image's Entrypoint is cleared
  std::vector<std::string> environment;  // "NAME=value", the payload's whole environment
  bool open_stdin = false;               // the payload reads stdin through an attach
  std::string session;                   // rlm-sandbox.session label
  std::string owner;                     // rlm-sandbox.owner label (ownership.hpp)
};

// The JSON body for POST /containers/create. Call require_supported() first; optional binds whose
// source is missing on the host are left out, as the namespace backend does. The policy's Python
// directories are read-only binds at their host paths; throws Error when they cannot be exposed.
nlohmann::json create_body(const Policy& policy, const ContainerPlan& plan);

}  // namespace rlm::docker
