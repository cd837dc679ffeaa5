// The Session of every backend whose payload can inherit an fd (namespace, local).
#pragma once

#include <memory>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::session {

// Starts the Python worker as a payload of backend.run() and waits for its hello. Throws Error
// when it does not come (python3 missing in the sandbox, the policy forbids what it needs, ...).
std::unique_ptr<Session> open_worker_session(Backend& backend, const Policy& policy,
                                             SessionOptions options);

}  // namespace rlm::session
