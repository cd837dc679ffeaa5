// The Python REPL worker's script (worker/python/'s parts, concatenated in parts.txt's order),
// embedded at build time: the sandbox needs python3 and nothing else installed.
#pragma once

#include <string_view>

namespace rlm::session {

std::string_view worker_source();

}  // namespace rlm::session
