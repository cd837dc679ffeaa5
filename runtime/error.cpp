#include "rlm_sandbox/error.hpp"

namespace rlm {
namespace {

std::string summarize(const std::string& origin, const std::vector<Diagnostic>& diagnostics) {
  std::string text = "policy " + origin + ":";
  if (diagnostics.size() == 1) return text + " " + diagnostics.front().to_string();
  text += " " + std::to_string(diagnostics.size()) + " errors";
  for (const auto& d : diagnostics) text += "\n  " + d.to_string();
  return text;
}

}  // namespace

std::string Diagnostic::to_string() const {
  return path.empty() ? message : path + ": " + message;
}

PolicyError::PolicyError(std::string origin, std::vector<Diagnostic> diagnostics)
    : Error(summarize(origin, diagnostics)),
      origin_(std::move(origin)),
      diagnostics_(std::move(diagnostics)) {}

}  // namespace rlm
