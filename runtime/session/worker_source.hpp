// The text of worker/python/rlm_worker.py, embedded at build time: the sandbox needs python3 and
// nothing else installed.
#pragma once

#include <string_view>

namespace rlm::session {

std::string_view worker_source();

}  // namespace rlm::session
