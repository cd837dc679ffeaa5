// The canonical spellings shared by parsing, printing and backend selection.
#include "rlm_sandbox/policy.hpp"

namespace rlm {

std::vector<std::string> known_backend_names() {
  return {"namespace", "docker", "landlock", "local"};
}

std::string_view to_string(Network network) {
  switch (network) {
    case Network::none:
      return "none";
    case Network::host:
      return "host";
    case Network::allowlist:
      return "allowlist";
  }
  return "none";
}

std::string_view to_string(Mount::Type type) {
  switch (type) {
    case Mount::Type::bind:
      return "bind";
    case Mount::Type::tmpfs:
      return "tmpfs";
  }
  return "bind";
}

}  // namespace rlm
