// The validating conversion from a merged JSON document to a Policy, shared by every loader.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::policy {

// Fills a Policy from `document` (defaults for what it leaves out) and appends every problem to
// `diagnostics`. The Policy is meaningful only when nothing was appended.
Policy read_policy(const nlohmann::json& document, std::string name,
                   std::vector<Diagnostic>& diagnostics);

}  // namespace rlm::policy
