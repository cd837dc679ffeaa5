// Errors a caller can act on. A sandboxed program failing is a Result, never an exception; these
// are for misconfiguration (bad policy, bad request, no usable backend), and their message says
// what is wrong and how to fix it.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace rlm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One problem found in a policy document, located by its JSON path ("limits.memory_bytes",
// "filesystem.mounts[2].target"; empty for the document itself).
struct Diagnostic {
  std::string path;
  std::string message;
  // "limits.memroy_bytes: unknown key; did you mean memory_bytes?"
  std::string to_string() const;
};

// A policy that failed to load or validate; carries every problem found, not just the first.
class PolicyError : public Error {
 public:
  PolicyError(std::string origin, std::vector<Diagnostic> diagnostics);
  const std::string& origin() const { return origin_; }
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::string origin_;
  std::vector<Diagnostic> diagnostics_;
};

// No backend that meets the policy can run here (fail closed). The message names what is
// missing and how to get it.
class BackendUnavailable : public Error {
 public:
  using Error::Error;
};

// This build has no HTTP client (the statically linked CLI, which leaves libcurl out to start
// fast). The CLI answers it by re-executing its dynamically linked sibling; a library user never
// sees it, since the library always has the real client.
class NeedsFullBinary : public Error {
 public:
  using Error::Error;
};

}  // namespace rlm
