#include "supervisor/run_start.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <utility>

#include "policy/python_environment.hpp"
#include "rlm_sandbox/error.hpp"
#include "supervisor/init.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/supervise.hpp"

extern char** environ;

namespace rlm::supervisor {
namespace {

void check_variable(const std::string& name, const std::string& value, const char* origin) {
  if (name.empty() || name.find_first_of(std::string("=\0", 2)) != std::string::npos)
    throw Error(std::string(origin) + ": environment variable name '" + name +
                "' is invalid (it must be non-empty and hold no '=')");
  if (value.find('\0') != std::string::npos)
    throw Error(std::string(origin) + ": the value of environment variable " + name +
                " holds a NUL byte");
}

// The request's variables, and the policy's Python site directories where it exposes some (a
// request that sets the variable itself keeps its value). Throws Error when the directories
// cannot be exposed on this host.
std::map<std::string, std::string> request_variables(const Request& request, const Policy& policy) {
  auto variables = request.env;
  if (policy.python.venv || !policy.python.site_packages.empty())
    variables.try_emplace(policy::kSiteDirsVariable,
                          policy::site_dirs_value(policy::python_dirs(policy)));
  return variables;
}

}  // namespace

std::string unenforceable_network(const Policy& policy, std::string_view backend) {
  if (policy.network != Network::allowlist) return "";
  return "network: the " + std::string(backend) +
         " backend does not enforce an egress allowlist, and a run never gets more network than "
         "its policy asks for, so it does not start; to fix: run it on the namespace or docker "
         "backend (--backend), or use \"network\": \"none\"";
}

std::vector<std::string> payload_environment(const Environment& rules,
                                             const std::map<std::string, std::string>& request_env,
                                             const std::vector<NetworkInjection>& injections) {
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
  if (!injections.empty())
    for (const char* name : {"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT",
                             "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"})
      variables[name] = kInjectionTrustBundle;
  for (const auto& [name, value] : request_env) {
    check_variable(name, value, "request env");
    variables[name] = value;
  }
  // Last: not even a request's own value (the CLI's `-e NAME` copies the caller's) gets through.
  for (const auto& injection : injections)
    if (!injection.value_from_env.empty()) variables.erase(injection.value_from_env);
  std::vector<std::string> entries;
  entries.reserve(variables.size());
  for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
  return entries;
}

bool uses_payload_stdio(const Request& request) {
  const auto& fds = request.payload_stdio;
  const auto given = std::count_if(fds.begin(), fds.end(), [](int fd) { return fd >= 0; });
  if (given == 0) return false;
  if (given != 3)
    throw Error("Request.payload_stdio: give all three fds (stdin, stdout, stderr) or none");
  if (!request.stdin_data.empty() || request.stdin_fd >= 0 || request.on_stdout ||
      request.on_stderr)
    throw Error(
        "Request.payload_stdio: the payload's stdio are the caller's fds, so stdin_data, stdin_fd, "
        "on_stdout and on_stderr must be unset");
  return true;
}

RunStart::RunStart(std::string_view backend, const Request& request, const Policy& policy)
    : argv(resolve_argv(request)),
      wall_limit(effective_wall_time(request, policy)),
      environment(payload_environment(policy.env, request_variables(request, policy),
                                      policy.egress.inject)),
      start(Clock::now()) {
  uses_payload_stdio(request);  // throws for a request that mixes it with the other stdio
  result.backend = backend;
  result.policy = policy.name;
}

Result RunStart::finish() {
  result.wall = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  return std::move(result);
}

Result RunStart::setup_failed(std::string detail) {
  result.status = Status::sandbox_error;
  result.detail = std::move(detail);
  return finish();
}

void RunStart::fill_from(RunEnd end) {
  classify(std::move(end), result);
}

void RunStart::fill_from(Supervision supervision, const RunContext& context) {
  fill_from(init_run_end(std::move(supervision), context));
}

Result RunStart::supervise_to_the_end(const Request& request, InitProcess& process,
                                      SupervisionOptions options, const RunContext& context) {
  if (request.on_started) request.on_started({[] { return LiveCounters{}; }, nullptr});
  fill_from(supervise_init(process, std::move(options)), context);
  return finish();
}

}  // namespace rlm::supervisor
