#include "common/init_locator.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "rlm_init/protocol.hpp"

namespace rlm::common {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::vector<std::string> default_candidates() {
  std::vector<std::string> candidates;
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const auto dir = self.parent_path();
    candidates.push_back((dir / init_protocol::kBinaryName).string());
    candidates.push_back(
        (dir.parent_path() / "libexec/rlm-sandbox" / init_protocol::kBinaryName).string());
  }
  candidates.push_back(RLM_SANDBOX_INIT_INSTALL_PATH);
  candidates.push_back(RLM_SANDBOX_INIT_BUILD_PATH);
  return candidates;
}

}  // namespace

std::string InitLocation::problem() const {
  if (!path.empty()) return "";
  std::string text = std::string(init_protocol::kBinaryName) + " not found (looked for";
  for (std::size_t i = 0; i < tried.size(); ++i) text += (i ? ", " : " ") + tried[i];
  return text + ")";
}

std::string InitLocation::fix() {
  return "build the rlm-sandbox-init target (it lands next to the rlm-sandbox binary), install "
         "rlm-sandbox, or set RLM_SANDBOX_INIT to the path of rlm-sandbox-init";
}

InitLocation locate_init() {
  InitLocation location;
  if (const char* explicit_path = std::getenv("RLM_SANDBOX_INIT");
      explicit_path && *explicit_path) {
    location.tried.push_back(std::string("$RLM_SANDBOX_INIT=") + explicit_path);
    if (is_executable_file(explicit_path)) location.path = explicit_path;
    return location;
  }
  for (auto& candidate : default_candidates()) {
    if (is_executable_file(candidate)) {
      location.path = candidate;
      break;
    }
    location.tried.push_back(std::move(candidate));
  }
  return location;
}

}  // namespace rlm::common
