#include "rlm_sandbox/error.hpp"

namespace rlm {
namespace {

// Built by appending: GCC 12 at -O3 (Release) reports a false -Wrestrict on
// `"literal" + std::string` here (GCC bug 105329).
std::string summarize(const std::string& origin, const std::vector<Diagnostic>& diagnostics) {
  std::string text = "policy ";
  text += origin;
  text += ':';
  if (diagnostics.size() == 1) {
    text += ' ';
    text += diagnostics.front().to_string();
    return text;
  }
  text += ' ';
  text += std::to_string(diagnostics.size());
  text += " errors";
  for (const auto& d : diagnostics) {
    text += "\n  ";
    text += d.to_string();
  }
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
