// `rlm-sandbox run`: one command or piece of code under a policy.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>

#include "cli.hpp"
#include "interrupts.hpp"
#include "limit_flags.hpp"
#include "policy_flags.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/units.hpp"
#include "server_client.hpp"
#include "terminal.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"(usage: rlm-sandbox run [OPTIONS] [--] CMD [ARGS...]
       rlm-sandbox run [OPTIONS] --code CODE [--language python|bash|sh]

Runs CMD (or CODE) under a policy and reports what happened. The payload's output streams live
to this process's stdout and stderr, and its stdin is forwarded, unless --json is given.
Limit flags may only tighten the policy, never loosen it.

Options end at "--" or at the first word that is not an option: `run ls -la /` runs `ls -la /`.
Mounts (--bind, --bind-ro, -v, --tmpfs) are applied after the policy's, in the order given, as
bwrap does: a later mount may sit inside an earlier one (--bind-ro "$PWD:/work" then
--bind "$PWD/out:/work/out"). SRC:DST:ro and SRC:DST:rw choose the mode, as docker's -v does.
What the payload writes through a writable bind is yours on the host (root's, run as root), and
it may write wherever you may there: the bind is idmapped to you. A filesystem that cannot be
idmapped is named before the run, with the fix (as root where nothing can be idmapped, the
sandbox writes where anyone may, and an inert uid gets what it wrote).
Units: a duration is seconds when bare (30) or 500ms, 1.5s, 2m, 1h; a size needs its unit
(64M, 1G, 4096B).

With --json (or --result-file) every failure yields a Result, also one found before the run
(status sandbox_error).

Terminal: -t gives the payload a pseudo-terminal (a shell or REPL prompts; Ctrl-C, Ctrl-Z and a
resize reach it through it), relayed to this one; -it also passes your keys on (raw mode), as
docker run -it does.

Signals: SIGINT, SIGTERM and SIGHUP to this command stop the run: the payload gets SIGTERM and
the policy's kill grace (its handler runs), the Result says status interrupted and the signal,
and the exit status is 128+N (130 for a Ctrl-C).

exit status: the payload's own; 128+N if it died of signal N (an OOM kill is 137), or if
             this command got signal N and stopped the run;
             124 timeout; 125 the sandbox could not be set up (stderr says why);
             126 the command could not be executed; 127 it was not found;
             2 bad usage (an unknown flag or a value that means nothing, e.g. --memory 512).
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox run -- python3 -c 'print(6 * 7)'
  rlm-sandbox run --policy strict --bind-ro "$PWD:/work" -w /work --memory 64M --timeout 2s \
      -- ./untrusted-binary
  rlm-sandbox run --json --code 'import os; print(os.getuid())'
  rlm-sandbox run --bind-ro "$PWD:/src" --workdir /src --result-file result.json -- make test
  rlm-sandbox run --bind-ro "$PWD:/work" --bind "$PWD/out:/work/out" -w /work ./untrusted
  rlm-sandbox run -v "$PWD/data:/data:ro" -v "$PWD/job.py:/job.py:ro" --timeout 5 --memory 128M \
      python3 /job.py
  rlm-sandbox run -t -- ls --color=auto /   (colours: the payload writes to a terminal)
  rlm-sandbox run --policy trusted-local --json -- sh -c 'echo hi; exit 3'
  rlm-sandbox run --server /run/rlm-sandbox.sock -- /bin/true   (a warm sandbox of `serve`)
)";

bool stdin_is_open() {
  return fcntl(STDIN_FILENO, F_GETFD) != -1;
}

// --result-file PATH: a file is made in PATH's directory before anything runs (a path that cannot
// be written fails the command before the payload starts) and given PATH's name once the Result is
// in it, so PATH is never half a Result. The directory may be one the payload writes (a bind): the
// file has no name there while the payload runs (O_TMPFILE; where the filesystem has none, a
// random name made with O_EXCL), and nothing is opened by a name the payload could have planted.
class ResultFile {
 public:
  explicit ResultFile(std::string path) : path_(std::move(path)) {
    const auto slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash ? slash : 1);
    name_ = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    if (name_.empty() || name_ == "." || name_ == "..")
      throw Error("--result-file " + path_ + ": names a directory, not a file");
    dir_ = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_ < 0) fail("cannot open its directory " + dir, errno);
    mode_t mask = umask(0);
    umask(mask);
    fd_ = openat(dir_, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666 & ~mask);
    if (fd_ < 0 && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
      fail("cannot create a file in " + dir, errno);
    if (fd_ < 0) {  // no O_TMPFILE here: a name nobody can have planted
      for (int attempt = 0; fd_ < 0 && attempt < 16; ++attempt) {
        temporary_ = unique_name();
        fd_ = openat(dir_, temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0666 & ~mask);
        if (fd_ < 0 && errno != EEXIST) fail("cannot create a file in " + dir, errno);
      }
      if (fd_ < 0) fail("cannot create a file in " + dir, EEXIST);
    }
  }
  ~ResultFile() {
    if (fd_ >= 0) close(fd_);
    if (!temporary_.empty()) unlinkat(dir_, temporary_.c_str(), 0);  // never written: no stray
    if (dir_ >= 0) close(dir_);
  }
  ResultFile(const ResultFile&) = delete;
  ResultFile& operator=(const ResultFile&) = delete;

  void write(const Result& result) {
    bool written = write_all(fd_, result.to_json().dump(2) + "\n");
    if (written && temporary_.empty()) {  // O_TMPFILE: a name now, a fresh one, then PATH's
      const std::string self = "/proc/self/fd/" + std::to_string(fd_);
      written = false;
      for (int attempt = 0; !written && attempt < 16; ++attempt) {
        temporary_ = unique_name();
        written = linkat(AT_FDCWD, self.c_str(), dir_, temporary_.c_str(), AT_SYMLINK_FOLLOW) == 0;
        if (!written && errno != EEXIST) {
          temporary_.clear();
          break;
        }
      }
    }
    close(fd_);
    fd_ = -1;
    if (!written || renameat(dir_, temporary_.c_str(), dir_, name_.c_str()) != 0) {
      const int error = errno;
      fail("cannot write it", error);
    }
    temporary_.clear();
  }

 private:
  [[noreturn]] void fail(const std::string& what, int error) const {
    throw Error("--result-file " + path_ + ": " + what + ": " + std::strerror(error));
  }
  std::string unique_name() const {
    static std::mt19937_64 random{std::random_device{}()};
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(random()));
    return "." + name_ + "." + suffix;
  }

  std::string path_, name_, temporary_;
  int dir_ = -1, fd_ = -1;
};

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
  if (result.status == Status::sandbox_error || result.detail.find("note: ") == std::string::npos)
    return;
  const bool detail_printed = !as_json && result.status != Status::ok &&
                              !(result.status == Status::exit_nonzero && result.detail.empty());
  if (detail_printed) return;
  if (result.unenforced.empty()) {  // a note of another kind (how a bind was written)
    print_error(result.detail.substr(result.detail.find("note: ")));
    return;
  }
  std::string line = "note: not enforced as the policy means them here: ";
  for (std::size_t i = 0; i < result.unenforced.size(); ++i)
    line += (i ? ", " : "") + result.unenforced[i];
  if (!result.detail.empty()) line += " (" + result.detail + ")";
  print_error(line);
}

// An allowlist run's denials, one line each on stderr (the Result has them all, with the allowed
// connections): what the sandbox tried and was refused, so a missing allow entry is found at once.
// Names come from the sandbox: printed with anything but printable ASCII escaped, so a name cannot
// drive the terminal.
void report_network_denials(const Result& result) {
  if (!result.network) return;
  constexpr std::size_t kLines = 20;
  auto printable = [](const std::string& text) {
    std::string out;
    for (const unsigned char c : text) {
      if (c >= 0x20 && c < 0x7f && c != '\\') {
        out += static_cast<char>(c);
      } else {
        char escaped[5];
        std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
        out += escaped;
      }
    }
    return out;
  };
  const auto& denied = result.network->denied;
  for (std::size_t i = 0; i < denied.size() && i < kLines; ++i) {
    const auto& entry = denied[i];
    std::string line = "network: denied (" + entry.kind + ")";
    if (!entry.name.empty()) line += " " + printable(entry.name);
    if (!entry.destination.empty())
      line += (entry.name.empty() ? " " : " at ") + entry.destination + ":" +
              std::to_string(entry.port);
    else if (entry.port && entry.kind != "dns")
      line += " port " + std::to_string(entry.port);
    if (entry.count > 1) line += " (" + std::to_string(entry.count) + " times)";
    print_error(line);
  }
  if (denied.size() > kLines || result.network->truncated)
    print_error("network: more denials than shown; the Result (--json, --result-file) has them");
}

// The common case through a server, `run [--server S] [--policy P] -- CMD [ARGS...]` (the server
// named by --server or RLM_SANDBOX_SERVER), read without building the option table: it means
// exactly what the general parser makes of it, a tenth of a millisecond sooner (a few percent of
// a warm run). Anything else, or anything unusual in these words, goes to the general parser.
std::optional<int> run_plainly_on_server(const std::vector<std::string>& args) {
  std::optional<std::string> socket, policy;
  auto word = args.begin();
  for (; word != args.end() && word->size() > 1 && word->front() == '-'; ++word) {
    if (*word == "--") break;
    auto* slot = *word == "--server"                      ? &socket
                 : (*word == "--policy" || *word == "-p") ? &policy
                                                          : nullptr;
    if (!slot || *slot || std::next(word) == args.end()) return std::nullopt;
    ++word;
    if (word->empty() || word->front() == '-') return std::nullopt;
    *slot = *word;
  }
  if (word != args.end() && *word == "--") ++word;
  if (word == args.end()) return std::nullopt;
  if (!socket) socket = server_from_environment();
  if (!socket || socket->empty()) return std::nullopt;

  Request request;
  request.argv.assign(word, args.end());
  request.argv = resolve_argv(request);
  if (stdin_is_open()) request.stdin_fd = STDIN_FILENO;
  request.on_stdout = [](std::string_view data) { write_all(STDOUT_FILENO, data); };
  request.on_stderr = [](std::string_view data) { write_all(STDERR_FILENO, data); };
  const Interrupts interrupts;
  request.stop_fd = interrupts.stop_fd();
  Result result =
      run_on_server(*socket, std::nullopt, std::nullopt, policy.value_or("default"), request, {});
  interrupts.explain(result);
  report_outcome(result);
  report_stand_ins(result, false);
  report_network_denials(result);
  return exit_status(result);
}

po::options_description run_options() {
  po::options_description options("options");
  options.add_options()             //
      ("help,h", "show this help")  //
      ("policy,p", po::value<std::string>()->default_value("default"),
       "shipped policy name (default, strict, python-repl, ci, trusted-local, landlock) or a JSON "
       "file")  //
      ("backend,b", po::value<std::string>()->default_value("auto"),
       "auto, namespace, docker, landlock or local; auto tries the policy's backend.prefer in "
       "order")  //
      ("tty,t", po::bool_switch(),
       "give the payload a terminal (a pseudo-terminal relayed to this one; not with --json)")  //
      ("interactive,i", po::bool_switch(),
       "with -t, pass this process's stdin to it (without -t stdin is always passed on)")  //
      ("timeout", po::value<std::string>(),
       "wall-clock limit: seconds (30) or 500ms, 1.5s, 2m, 1h")                                 //
      ("cpu-time", po::value<std::string>(), "CPU-time limit, e.g. 5s")                         //
      ("memory,m", po::value<std::string>(), "memory limit with its unit: 256M, 1G")            //
      ("pids", po::value<std::string>(), "process limit")                                       //
      ("cpus", po::value<std::string>(), "CPU bandwidth, e.g. 0.5 or 2")                        //
      ("workdir,w", po::value<std::string>(), "working directory inside the sandbox")           //
      ("hostname", po::value<std::string>(), "the sandbox's hostname (the policy's hostname)")  //
      ("network", po::value<std::string>(),
       "none or host: the sandbox's network; may only tighten the policy (host to none)")  //
      ("allow-net", po::value<std::vector<std::string>>()->composing(),
       "ENTRY: narrow the network to an egress allowlist entry (pypi.org:443, https://NAME, "
       "10.0.0.0/8:5432; repeatable); never widens it. Not enforced by this build yet: such a "
       "run is refused (exit 125)")  //
      ("quiet,q", po::bool_switch(),
       "no notes on stderr (what a run could not enforce as meant)")         //
      ("image", po::value<std::string>(), "the docker backend's image")      //
      ("code,c", po::value<std::string>(), "run CODE instead of a command")  //
      ("language,l", po::value<std::string>()->default_value("python"),
       "language of --code: python, bash or sh")  //
      ("json", po::bool_switch(),
       "capture the output and print the Result JSON on stdout (output is inside it)")  //
      ("result-file", po::value<std::string>(),
       "stream the output live and write the Result JSON to this file")  //
      ("server", po::value<std::string>(), kServerFlagHelp)              //
      ("fleet", po::value<std::string>(), kFleetFlagHelp)                //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp);
  add_tls_flags(options);
  add_mount_and_env_options(options);
  return options;
}

int run_parsed(const CommandLine& line, const po::options_description& options,
               std::optional<ResultFile>& result_file) {
  std::vector<po::option> in_order;
  auto values = parse_options(line.options, options, "run", nullptr, &in_order);
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  const bool as_json = values["json"].as<bool>();
  if (as_json && values.count("result-file"))
    throw UsageError("--json and --result-file are alternatives; give one", "run");
  const bool tty = values["tty"].as<bool>();
  if (tty && as_json)
    throw UsageError("--tty and --json are alternatives: a terminal's output is not captured",
                     "run");
  Request request;
  if (values.count("code")) {
    if (!line.payload.empty()) throw UsageError("give a command or --code, not both", "run");
    request.code = values["code"].as<std::string>();
    request.language = values["language"].as<std::string>();
    check_choice("--language", request.language, {"python", "bash", "sh"});
  } else if (line.payload.empty()) {
    throw UsageError("no command given; usage: rlm-sandbox run [OPTIONS] [--] CMD [ARGS...]",
                     "run");
  } else {
    request.argv = line.payload;
  }
  check_choice("--backend", values["backend"].as<std::string>(),
               {"auto", "namespace", "docker", "landlock", "local"});

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
  const std::vector<MountFlag> mounts = mount_flags(in_order);
  if (values.count("network"))
    check_choice("--network", values["network"].as<std::string>(), {"none", "host"});
  add_env_flags(values, request.env);
  // The command, resolved once, here: the backend takes the argv as it is.
  request.argv = resolve_argv(request);
  request.code.clear();
  request.language.clear();
  // Before anything runs: a Result that could not be written is a failure found now.
  if (values.count("result-file")) result_file.emplace(values["result-file"].as<std::string>());

  std::optional<PayloadTerminal> terminal;
  if (tty) {
    terminal.emplace(values["interactive"].as<bool>());
    request.payload_stdio = terminal->payload_stdio();
  } else {
    if (stdin_is_open()) request.stdin_fd = STDIN_FILENO;
    if (!as_json) {
      request.on_stdout = [](std::string_view data) { write_all(STDOUT_FILENO, data); };
      request.on_stderr = [](std::string_view data) { write_all(STDERR_FILENO, data); };
    }
  }
  const Interrupts interrupts;
  request.stop_fd = interrupts.stop_fd();
  Result result;
  std::optional<Policy> run_policy;  // the policy the flags made, when they changed it
  const auto fleet = fleet_of(values);
  if (fleet || server_socket(values)) {
    // Nothing about the policy is loaded here unless a flag changes it: the server has it.
    const bool changed = overrides.wall_time || overrides.cpu_time || overrides.memory_bytes ||
                         overrides.pids || overrides.cpus || changes_policy(mounts, values);
    std::function<Policy(Policy)> change;
    if (changed)
      change = [&](Policy policy) {
        tighten(policy, overrides);
        run_policy = apply_policy_flags(std::move(policy), mounts, values);
        return *run_policy;
      };
    if (terminal) terminal->start();
    result = fleet ? run_on_fleet(*fleet, values["policy"].as<std::string>(), request, change)
                   : run_on_server(*server_socket(values), server_uid(values), tls_files(values),
                                   values["policy"].as<std::string>(), request, change);
  } else {
    Policy policy = load_policy(values["policy"].as<std::string>());
    tighten(policy, overrides);
    run_policy = apply_policy_flags(std::move(policy), mounts, values);
    auto backend = select_backend(*run_policy, values["backend"].as<std::string>());
    if (terminal) terminal->start();
    result = backend->run(request, *run_policy);
  }
  if (run_policy) result.detail = name_mount_flags(std::move(result.detail), *run_policy, mounts);
  if (terminal) terminal->finish();
  interrupts.explain(result);

  if (as_json) {
    std::cout << result.to_json().dump() << std::endl;
    if (result.status == Status::sandbox_error) print_error(result.detail);
  } else {
    if (result_file) result_file->write(result);
    report_outcome(result);
  }
  if (!values["quiet"].as<bool>()) {
    report_stand_ins(result, as_json);
    report_network_denials(result);
  }
  return exit_status(result);
}

// A failure found before the run, as a Result where one was asked for: on stdout (--json) or in
// the result file. The message itself goes to stderr as for every failure.
void report_early_failure(bool as_json, std::optional<ResultFile>& result_file,
                          const std::string& message) {
  Result result;
  result.status = Status::sandbox_error;
  result.detail = message;
  if (as_json) std::cout << result.to_json().dump() << std::endl;
  if (result_file) {
    try {
      result_file->write(result);
    } catch (const Error&) {  // the message that matters is the first one
    }
  }
}

}  // namespace

int run_command(const std::vector<std::string>& args) {
  if (auto status = run_plainly_on_server(args)) return *status;
  const auto options = run_options();
  const auto line = split_at_command(args, options);
  // Read off the words, so that a failure of the parser itself still yields its Result.
  bool as_json = false;
  std::optional<std::string> result_path;
  for (std::size_t i = 0; i < line.options.size(); ++i) {
    const auto& word = line.options[i];
    if (word == "--json") as_json = true;
    if (word == "--result-file" && i + 1 < line.options.size()) result_path = line.options[i + 1];
    if (word.rfind("--result-file=", 0) == 0) result_path = word.substr(14);
  }
  std::optional<ResultFile> result_file;
  const auto report = [&](const std::string& message) {
    if (!result_file && result_path && !as_json) {
      try {
        result_file.emplace(*result_path);
      } catch (const Error&) {  // the message that matters is the first one
      }
    }
    report_early_failure(as_json, result_file, message);
  };
  try {
    return run_parsed(line, options, result_file);
  } catch (const NeedsFullBinary&) {
    throw;  // the sibling binary runs the same command and reports for it
  } catch (const UsageError& error) {
    report(error.what());
    throw;
  } catch (const Error& error) {
    report(error.what());
    throw;
  }
}

}  // namespace rlm::cli
