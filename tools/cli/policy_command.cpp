// `rlm-sandbox policy check|show|list`: policy files as a CI job or a person edits them.
#include <iostream>

#include "cli.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/seccomp_profile.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox policy check NAME|FILE...
       rlm-sandbox policy show NAME|FILE
       rlm-sandbox policy export --docker-seccomp NAME|FILE
       rlm-sandbox policy list

  check   validate each policy after resolving "extends"; print every problem with its JSON
          path; exit 1 when any policy has a problem
  show    print the effective policy (after "extends", every field explicit) as JSON
  export  --docker-seccomp: print the policy's seccomp rules, layered on the mandatory preamble,
          as a Docker seccomp profile (docker run --security-opt seccomp=FILE)
  list    print the names of the shipped policies

NAME is a shipped policy (see 'policy list') or one in $RLM_SANDBOX_POLICY_PATH; FILE is a path.
docs/policy.md documents every field.

examples:
  rlm-sandbox policy check my-policy.json
  rlm-sandbox policy show strict
  rlm-sandbox policy show my-policy.json | jq .limits
  rlm-sandbox policy export --docker-seccomp strict > strict-seccomp.json
)";

int check(const std::vector<std::string>& targets) {
  if (targets.empty()) throw UsageError("policy check needs at least one NAME or FILE", "policy");
  int problems = 0;
  for (const auto& target : targets) {
    auto diagnostics = check_policy(target);
    if (diagnostics.empty()) {
      std::cout << target << ": ok\n";
      continue;
    }
    problems += static_cast<int>(diagnostics.size());
    for (const auto& diagnostic : diagnostics)
      std::cerr << target << ": " << diagnostic.to_string() << "\n";
  }
  if (problems > 0) {
    std::cerr << problems << (problems == 1 ? " problem" : " problems") << " found\n";
    return kExitPolicyInvalid;
  }
  return 0;
}

}  // namespace

int policy_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()                                                                     //
      ("help,h", "show this help")                                                          //
      ("docker-seccomp", po::bool_switch(), "with export: print a Docker seccomp profile")  //
      ("words", po::value<std::vector<std::string>>(), "");
  auto values = parse_options(args, options, "policy", "words");
  std::vector<std::string> words;
  if (values.count("words")) words = values["words"].as<std::vector<std::string>>();
  if (values.count("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (words.empty()) throw UsageError("policy needs a subcommand: check, show or list", "policy");
  const std::string subcommand = words.front();
  const std::vector<std::string> targets(words.begin() + 1, words.end());
  if (subcommand == "check") return check(targets);
  if (subcommand == "show") {
    if (targets.size() != 1) throw UsageError("policy show takes one NAME or FILE", "policy");
    std::cout << load_policy(targets.front()).to_json().dump(2) << "\n";
    return 0;
  }
  if (subcommand == "export") {
    if (!values["docker-seccomp"].as<bool>())
      throw UsageError("policy export needs a format: --docker-seccomp", "policy");
    if (targets.size() != 1) throw UsageError("policy export takes one NAME or FILE", "policy");
    std::cout << seccomp::docker_profile(load_policy(targets.front()).seccomp).dump(2) << "\n";
    return 0;
  }
  if (subcommand == "list") {
    for (const auto& name : shipped_policy_names()) std::cout << name << "\n";
    return 0;
  }
  throw UsageError("unknown policy subcommand '" + subcommand + "'; use check, show or list",
                   "policy");
}

}  // namespace rlm::cli
