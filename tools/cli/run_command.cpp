// `rlm-sandbox run`: one command or piece of code under a policy.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>

#include "cli.hpp"
#include "limit_flags.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/units.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox run [OPTIONS] -- CMD [ARGS...]
       rlm-sandbox run [OPTIONS] --code CODE [--language python|bash|sh]

Runs CMD (or CODE) under a policy and reports what happened. The payload's output streams live
to this process's stdout and stderr, and its stdin is forwarded, unless --json is given.
Limit flags may only tighten the policy, never loosen it.

exit status: the payload's own; 128+N if it died of signal N (an OOM kill is 137);
             124 timeout; 125 the sandbox could not be set up (stderr says why);
             126 the command could not be executed; 127 it was not found; 2 bad usage.
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox run -- python3 -c 'print(6 * 7)'
  rlm-sandbox run --policy strict --memory 64M --timeout 2s -- ./untrusted-binary
  rlm-sandbox run --json --code 'import os; print(os.getuid())'
  rlm-sandbox run --bind-ro "$PWD:/src" --workdir /src --result-file result.json -- make test
  rlm-sandbox run --policy trusted-local --json -- sh -c 'echo hi; exit 3'
  rlm-sandbox run --server /run/rlm-sandbox.sock -- /bin/true   (a warm sandbox of `serve`)
)";

struct MountFlag {
  std::string source, target;
  Mount::Type type;
  bool readonly;
  std::optional<std::uint64_t> size;
  std::string shown;  // the flag as given, for messages: "--bind /srv/data:/data"
};

std::string absolute_target(const std::string& flag, const std::string& value,
                            const std::string& target) {
  if (target.empty() || target.front() != '/')
    throw Error(flag + " " + value + ": the path inside the sandbox must be absolute");
  return target;
}

// --bind SRC[:DST] and --bind-ro SRC[:DST]: SRC is a host path (relative to here), DST defaults
// to SRC's absolute form.
MountFlag bind_flag(const std::string& flag, const std::string& value, bool readonly) {
  auto colon = value.find(':');
  std::string source = value.substr(0, colon);
  std::error_code ec;
  auto absolute = std::filesystem::absolute(source, ec).lexically_normal().string();
  if (source.empty() || ec) throw Error(flag + " " + value + ": no source path");
  if (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
  if (!std::filesystem::exists(absolute, ec))
    throw Error(flag + " " + value + ": " + absolute + " does not exist on this host");
  std::string target = colon == std::string::npos ? absolute : value.substr(colon + 1);
  return {absolute,          absolute_target(flag, value, target), Mount::Type::bind, readonly, {},
          flag + " " + value};
}

// --tmpfs DST[:SIZE]
MountFlag tmpfs_flag(const std::string& value) {
  auto colon = value.rfind(':');
  std::string target = value.substr(0, colon);
  std::optional<std::uint64_t> size;
  if (colon != std::string::npos) size = size_flag("--tmpfs " + value, value.substr(colon + 1));
  return {"",
          absolute_target("--tmpfs", value, target),
          Mount::Type::tmpfs,
          false,
          size,
          "--tmpfs " + value};
}

// Flags that change the policy itself (mounts, workdir, image) are applied to a copy and the
// result validated again, so a flag can never produce a policy the loader would reject.
Policy apply_policy_flags(Policy policy, const std::vector<MountFlag>& mounts,
                          const po::variables_map& values) {
  for (const auto& flag : mounts) {
    // The policy's rule for kernel interfaces holds for flags too; said here, the message names
    // the flag rather than a position in the merged mount list.
    if (flag.type == Mount::Type::bind && !policy.filesystem.allow_kernel_interface_binds)
      if (auto reason = kernel_interface_in(flag.source))
        throw Error(flag.shown + ": " + flag.source + " " + *reason +
                    "; the policy must set filesystem.allow_kernel_interface_binds to bind it");
    auto& list = policy.filesystem.mounts;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Mount& m) { return m.target == flag.target; }),
               list.end());
    Mount mount;
    mount.source = flag.source;
    mount.target = flag.target;
    mount.type = flag.type;
    mount.readonly = flag.readonly;
    mount.size_bytes = flag.size;
    list.push_back(mount);
  }
  if (values.count("workdir")) {
    auto workdir = values["workdir"].as<std::string>();
    if (workdir.empty() || workdir.front() != '/')
      throw Error("--workdir " + workdir + ": must be an absolute path inside the sandbox");
    policy.filesystem.workdir = workdir;
  }
  if (values.count("image")) policy.docker.image = values["image"].as<std::string>();
  if (mounts.empty() && !values.count("workdir") && !values.count("image")) return policy;
  Policy checked = policy_from_json(policy.to_json(), policy.name + " with command-line flags");
  checked.name = policy.name;
  return checked;
}

bool stdin_is_open() {
  return fcntl(STDIN_FILENO, F_GETFD) != -1;
}

void write_result_file(const std::string& path, const Result& result) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << result.to_json().dump(2) << "\n";
    if (!out.flush()) throw Error("--result-file " + path + ": cannot write " + temporary);
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) throw Error("--result-file " + path + ": " + ec.message());
}

// One line on stderr for outcomes a person would otherwise miss in streamed mode.
void report_outcome(const Result& result) {
  if (result.status == Status::ok) return;
  if (result.status == Status::exit_nonzero && result.detail.empty()) return;
  std::string line = std::string(to_string(result.status));
  if (!result.detail.empty()) line += ": " + result.detail;
  print_error(line);
}

// A run whose limits were held by a stand-in (a per-process rlimit where no writable cgroup was)
// or, for want of one, not at all says so once on stderr, also with --json, whose stdout stays the
// Result alone. report_outcome already printed the detail, and with it the note, of a run that did
// not end ok.
void report_stand_ins(const Result& result, bool as_json) {
  // Only where the backend noted a stand-in ("note: ..." in the detail): an unisolated backend's
  // structural list (local) is health's to tell, not every run's.
  if (result.unenforced.empty() || result.status == Status::sandbox_error ||
      result.detail.find("note: ") == std::string::npos)
    return;
  const bool detail_printed = !as_json && result.status != Status::ok &&
                              !(result.status == Status::exit_nonzero && result.detail.empty());
  if (detail_printed) return;
  std::string line = "note: not enforced as the policy means them here: ";
  for (std::size_t i = 0; i < result.unenforced.size(); ++i)
    line += (i ? ", " : "") + result.unenforced[i];
  if (!result.detail.empty()) line += " (" + result.detail + ")";
  print_error(line);
}

// The common case through a server, `run [--server S] [--policy P] -- CMD [ARGS...]` (the server
// named by --server or RLM_SANDBOX_SERVER), read without building the option table: it means
// exactly what the general parser makes of it, a tenth of a millisecond sooner (a few percent of
// a warm run). Anything else, or anything unusual in these words, goes to the general parser.
std::optional<int> run_plainly_on_server(const std::vector<std::string>& args) {
  const auto dashdash = std::find(args.begin(), args.end(), "--");
  if (dashdash == args.end() || std::next(dashdash) == args.end()) return std::nullopt;
  std::optional<std::string> socket, policy;
  for (auto word = args.begin(); word != dashdash; ++word) {
    auto* slot = *word == "--server"                      ? &socket
                 : (*word == "--policy" || *word == "-p") ? &policy
                                                          : nullptr;
    if (!slot || *slot || std::next(word) == dashdash) return std::nullopt;
    ++word;
    if (word->empty() || word->front() == '-') return std::nullopt;
    *slot = *word;
  }
  if (!socket) socket = server_from_environment();
  if (!socket || socket->empty()) return std::nullopt;

  Request request;
  request.argv.assign(std::next(dashdash), args.end());
  request.argv = resolve_argv(request);
  if (stdin_is_open()) request.stdin_fd = STDIN_FILENO;
  request.on_stdout = [](std::string_view data) { write_all(STDOUT_FILENO, data); };
  request.on_stderr = [](std::string_view data) { write_all(STDERR_FILENO, data); };
  const Result result =
      run_on_server(*socket, std::nullopt, policy.value_or("default"), request, {});
  report_outcome(result);
  report_stand_ins(result, false);
  return exit_status(result);
}

}  // namespace

int run_command(const std::vector<std::string>& args) {
  if (auto status = run_plainly_on_server(args)) return *status;
  // Everything after "--" is the payload's argv, untouched by option parsing.
  auto dashdash = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> option_words(args.begin(), dashdash);
  std::vector<std::string> payload;
  if (dashdash != args.end()) payload.assign(dashdash + 1, args.end());

  po::options_description options("options");
  options.add_options()             //
      ("help,h", "show this help")  //
      ("policy,p", po::value<std::string>()->default_value("default"),
       "shipped policy name (default, strict, python-repl, ci, trusted-local, landlock) or a JSON "
       "file")  //
      ("backend,b", po::value<std::string>()->default_value("auto"),
       "auto, namespace, docker, landlock or local; auto tries the policy's backend.prefer in "
       "order")                                                                     //
      ("timeout,t", po::value<std::string>(), "wall-clock limit, e.g. 10s, 500ms")  //
      ("cpu-time", po::value<std::string>(), "CPU-time limit, e.g. 5s")             //
      ("memory,m", po::value<std::string>(), "memory limit, e.g. 256M")             //
      ("pids", po::value<std::string>(), "process limit")                           //
      ("cpus", po::value<std::string>(), "CPU bandwidth, e.g. 0.5 or 2")            //
      ("bind", po::value<std::vector<std::string>>()->composing(),
       "SRC[:DST] bind a host path read-write (repeatable)")  //
      ("bind-ro", po::value<std::vector<std::string>>()->composing(),
       "SRC[:DST] bind a host path read-only (repeatable)")  //
      ("tmpfs", po::value<std::vector<std::string>>()->composing(),
       "DST[:SIZE] a fresh tmpfs at DST (repeatable)")                                 //
      ("workdir,w", po::value<std::string>(), "working directory inside the sandbox")  //
      ("env,e", po::value<std::vector<std::string>>()->composing(),
       "K=V set an environment variable for the payload (repeatable)")       //
      ("image", po::value<std::string>(), "the docker backend's image")      //
      ("code,c", po::value<std::string>(), "run CODE instead of a command")  //
      ("language,l", po::value<std::string>()->default_value("python"),
       "language of --code: python, bash or sh")  //
      ("json", po::bool_switch(),
       "capture the output and print the Result JSON on stdout (output is inside it)")  //
      ("result-file", po::value<std::string>(),
       "stream the output live and write the Result JSON to this file")  //
      ("server", po::value<std::string>(), kServerFlagHelp)              //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp)       //
      ("args", po::value<std::vector<std::string>>(), "");

  po::options_description visible("options");
  for (const auto& option : options.options())
    if (option->long_name() != "args") visible.add(option);

  auto values = parse_options(option_words, options, "run", "args");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << visible << kExamples;
    return 0;
  }
  if (values.count("args")) {
    if (!payload.empty())
      throw UsageError(
          "unexpected '" + values["args"].as<std::vector<std::string>>().front() + "' before '--'",
          "run");
    payload = values["args"].as<std::vector<std::string>>();
  }
  const bool as_json = values["json"].as<bool>();
  if (as_json && values.count("result-file"))
    throw UsageError("--json and --result-file are alternatives; give one", "run");
  Request request;
  if (values.count("code")) {
    if (!payload.empty()) throw UsageError("give a command or --code, not both", "run");
    request.code = values["code"].as<std::string>();
    request.language = values["language"].as<std::string>();
  } else if (payload.empty()) {
    throw UsageError("no command given; usage: rlm-sandbox run [OPTIONS] -- CMD [ARGS...]", "run");
  } else {
    request.argv = payload;
  }

  // Everything a flag says is checked before the policy is even loaded.
  LimitOverrides overrides;
  if (values.count("timeout"))
    overrides.wall_time = duration_flag("--timeout", values["timeout"].as<std::string>());
  if (values.count("cpu-time"))
    overrides.cpu_time = duration_flag("--cpu-time", values["cpu-time"].as<std::string>());
  if (values.count("memory"))
    overrides.memory_bytes = size_flag("--memory", values["memory"].as<std::string>());
  if (values.count("pids")) overrides.pids = count_flag("--pids", values["pids"].as<std::string>());
  if (values.count("cpus")) overrides.cpus = cpus_flag("--cpus", values["cpus"].as<std::string>());
  std::vector<MountFlag> mounts;
  auto each = [&](const char* name, auto&& convert) {
    if (!values.count(name)) return;
    for (const auto& value : values[name].as<std::vector<std::string>>())
      mounts.push_back(convert(value));
  };
  each("bind", [](const std::string& v) { return bind_flag("--bind", v, false); });
  each("bind-ro", [](const std::string& v) { return bind_flag("--bind-ro", v, true); });
  each("tmpfs", [](const std::string& v) { return tmpfs_flag(v); });
  if (values.count("env")) {
    for (const auto& pair : values["env"].as<std::vector<std::string>>()) {
      auto equals = pair.find('=');
      if (equals == std::string::npos || equals == 0)
        throw Error("--env " + pair + ": expected NAME=VALUE");
      request.env[pair.substr(0, equals)] = pair.substr(equals + 1);
    }
  }
  // The command, resolved once, here: an unknown --language is rejected now, not after the
  // sandbox is up, and the backend takes the argv as it is.
  request.argv = resolve_argv(request);
  request.code.clear();
  request.language.clear();

  if (stdin_is_open()) request.stdin_fd = STDIN_FILENO;
  if (!as_json) {
    request.on_stdout = [](std::string_view data) { write_all(STDOUT_FILENO, data); };
    request.on_stderr = [](std::string_view data) { write_all(STDERR_FILENO, data); };
  }
  Result result;
  if (auto server = server_socket(values)) {
    // Nothing about the policy is loaded here unless a flag changes it: the server has it.
    const bool changed = overrides.wall_time || overrides.cpu_time || overrides.memory_bytes ||
                         overrides.pids || overrides.cpus || !mounts.empty() ||
                         values.count("workdir") || values.count("image");
    std::function<Policy(Policy)> change;
    if (changed)
      change = [&](Policy policy) {
        tighten(policy, overrides);
        return apply_policy_flags(std::move(policy), mounts, values);
      };
    result = run_on_server(*server, server_uid(values), values["policy"].as<std::string>(), request,
                           change);
  } else {
    Policy policy = load_policy(values["policy"].as<std::string>());
    tighten(policy, overrides);
    policy = apply_policy_flags(std::move(policy), mounts, values);
    auto backend = select_backend(policy, values["backend"].as<std::string>());
    result = backend->run(request, policy);
  }

  if (as_json) {
    std::cout << result.to_json().dump() << std::endl;
    if (result.status == Status::sandbox_error) print_error(result.detail);
  } else {
    if (values.count("result-file"))
      write_result_file(values["result-file"].as<std::string>(), result);
    report_outcome(result);
  }
  report_stand_ins(result, as_json);
  return exit_status(result);
}

}  // namespace rlm::cli
