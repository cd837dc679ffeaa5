#include "common/environment.hpp"

#include <cstdlib>

#include "rlm_sandbox/error.hpp"

extern char** environ;

namespace rlm::common {
namespace {

void check_variable(const std::string& name, const std::string& value, const char* origin) {
  if (name.empty() || name.find_first_of(std::string("=\0", 2)) != std::string::npos)
    throw Error(std::string(origin) + ": environment variable name '" + name +
                "' is invalid (it must be non-empty and hold no '=')");
  if (value.find('\0') != std::string::npos)
    throw Error(std::string(origin) + ": the value of environment variable " + name +
                " holds a NUL byte");
}

}  // namespace

std::vector<std::string> payload_environment(
    const Environment& rules, const std::map<std::string, std::string>& request_env) {
  std::map<std::string, std::string> variables;
  if (!rules.clear) {
    for (char** entry = environ; entry && *entry; ++entry) {
      const std::string text(*entry);
      const auto equals = text.find('=');
      if (equals == 0 || equals == std::string::npos) continue;
      variables[text.substr(0, equals)] = text.substr(equals + 1);
    }
  }
  // `set` is the fallback and `pass` the caller's explicit wish for its own value, so `pass`
  // wins where the host has the variable (trusted-local passes the host's HOME over /tmp).
  for (const auto& [name, value] : rules.set) {
    check_variable(name, value, "env.set");
    variables[name] = value;
  }
  for (const auto& name : rules.pass)
    if (const char* value = std::getenv(name.c_str())) variables[name] = value;
  for (const auto& [name, value] : request_env) {
    check_variable(name, value, "request env");
    variables[name] = value;
  }
  std::vector<std::string> entries;
  entries.reserve(variables.size());
  for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
  return entries;
}

}  // namespace rlm::common
