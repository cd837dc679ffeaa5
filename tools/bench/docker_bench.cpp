// rlm-docker-bench: what a run costs under the docker backend, beside Docker's own CLI.
//
// Measured interleaved, round by round in one process (the order rotates each round), so every
// column sees the same daemon and machine state:
//   - a one-shot run of /bin/true by the docker backend (in process: create, attach, start, wait,
//     inspect, remove), and the same through `rlm-sandbox run --backend docker` as a whole command
//     when that binary can reach the daemon;
//   - `docker run --rm --network none IMAGE /bin/true`, the whole command;
//   - one cell (`pass`) in an RLM session on the docker backend (rlm::Session, in process: the
//     Python worker in one container per session, reached through its bind-mounted socket);
//   - `docker exec CONTAINER python3 -c pass` into a long-lived container with the host's /usr
//     bound, as the session's is, the whole command.
// The docker CLI columns include the CLI's own start (a Go binary, a few tens of milliseconds);
// the rlm-sandbox CLI column includes ours, so the two whole-command columns compare like with
// like, and the in-process columns show what a library caller pays. Only the public API
// (rlm_sandbox/) is used.
//
// Without a daemon or the test image it says so and exits 0 (tools/docker-env sets both up).
//   rlm-docker-bench [--samples=N] [--warmup=N] [--image=IMAGE] [--docker=PATH]
//                    [--rlm-sandbox=PATH] [--csv=FILE]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  long samples = 50;
  long warmup = 3;
  std::string image = "rlm-sandbox-test:busybox";
  std::string docker;       // the docker CLI; default /usr/bin/docker, else from PATH
  std::string rlm_sandbox;  // default: next to this executable
  std::string csv;
};

struct Column {
  std::string label;
  std::string key;
  std::function<bool()> once;  // one sample; false when it failed
  std::string unavailable;     // why it is not measured; "" when it is
  std::vector<double> samples_ms;
  long failures = 0;
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()) - 1e-9));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// fork+exec+wait of argv with stdio on /dev/null; true when it exited 0.
bool spawn_quietly(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {0, 1, 2})
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  pid_t pid = -1;
  const int error = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string executable_dir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

std::optional<std::string> value_of(const std::string& arg, const char* name) {
  const std::string prefix = std::string(name) + "=";
  if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
  return std::nullopt;
}

long count_of(const std::string& text, const char* name) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || value < 0) {
    std::fprintf(stderr, "rlm-docker-bench: %s expects a non-negative integer\n", name);
    std::exit(2);
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (auto v = value_of(arg, "--samples")) {
      options.samples = std::max(1L, count_of(*v, "--samples"));
    } else if (auto v = value_of(arg, "--warmup")) {
      options.warmup = count_of(*v, "--warmup");
    } else if (auto v = value_of(arg, "--image")) {
      options.image = *v;
    } else if (auto v = value_of(arg, "--docker")) {
      options.docker = *v;
    } else if (auto v = value_of(arg, "--rlm-sandbox")) {
      options.rlm_sandbox = *v;
    } else if (auto v = value_of(arg, "--csv")) {
      options.csv = *v;
    } else {
      std::printf(
          "rlm-docker-bench [--samples=N] [--warmup=N] [--image=IMAGE] [--docker=PATH]\n"
          "                 [--rlm-sandbox=PATH] [--csv=FILE]\n"
          "  --samples=N   interleaved samples per column (default 50)\n"
          "  --warmup=N    unrecorded rounds first (default 3)\n");
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  if (options.docker.empty())
    options.docker = access("/usr/bin/docker", X_OK) == 0 ? "/usr/bin/docker" : "docker";
  if (options.rlm_sandbox.empty()) {
    // The dynamically linked CLI talks to the daemon itself; the static one re-executes it.
    const auto dir = executable_dir();
    options.rlm_sandbox = access((dir + "/rlm-sandbox-full").c_str(), X_OK) == 0
                              ? dir + "/rlm-sandbox-full"
                              : dir + "/rlm-sandbox";
  }
  return options;
}

// The shipped default policy on `image`: read-only binds of the host's /usr and friends (so the
// host's python3 runs inside), a tmpfs /tmp, no network.
rlm::Policy session_policy(const std::string& image) {
  rlm::Policy policy = rlm::load_policy("default");
  policy.docker.image = image;
  return policy;
}

// The image on its own: a tmpfs /tmp, nothing bound from the host.
rlm::Policy bench_policy(const std::string& image) {
  rlm::Policy policy = session_policy(image);
  rlm::Mount tmp;
  tmp.type = rlm::Mount::Type::tmpfs;
  tmp.target = "/tmp";
  tmp.readonly = false;
  policy.filesystem.mounts = {tmp};
  policy.env.set["PATH"] = "/usr/bin:/bin";
  return policy;
}

void print_table(const std::vector<Column>& columns, const Options& options) {
  std::printf(
      "\nrlm-docker-bench: wall time of one /bin/true (a session: one cell, `pass`), interleaved "
      "(%ld samples, image %s)\n",
      options.samples, options.image.c_str());
  std::printf("\n  %-44s %8s %8s %8s %8s %8s %6s\n", "milliseconds", "median", "p90", "p99", "min",
              "max", "fail");
  for (const auto& column : columns) {
    if (!column.unavailable.empty()) {
      std::printf("  %-44s unavailable: %s\n", column.label.c_str(), column.unavailable.c_str());
      continue;
    }
    auto sorted = column.samples_ms;
    std::sort(sorted.begin(), sorted.end());
    std::printf("  %-44s %8.1f %8.1f %8.1f %8.1f %8.1f %6ld\n", column.label.c_str(),
                percentile(sorted, 0.5), percentile(sorted, 0.9), percentile(sorted, 0.99),
                sorted.empty() ? 0 : sorted.front(), sorted.empty() ? 0 : sorted.back(),
                column.failures);
  }
  const auto median = [&](const std::string& key) {
    for (const auto& column : columns) {
      if (column.key != key || !column.unavailable.empty()) continue;
      auto sorted = column.samples_ms;
      std::sort(sorted.begin(), sorted.end());
      return percentile(sorted, 0.5);
    }
    return 0.0;
  };
  std::printf("\n");
  const auto ratio = [&](const char* what, const std::string& ours, const std::string& theirs) {
    if (median(ours) > 0 && median(theirs) > 0)
      std::printf("  %-52s %.3g\n", what, median(ours) / median(theirs));
  };
  ratio("one-shot in process / docker run (median):", "oneshot", "docker_run");
  ratio("rlm-sandbox run --backend docker / docker run:", "cli", "docker_run");
  ratio("session cell in process / docker exec (median):", "session", "docker_exec");
}

void write_csv(const std::vector<Column>& columns, const std::string& path) {
  std::ofstream out(path);
  std::vector<const Column*> measured;
  for (const auto& column : columns)
    if (column.unavailable.empty()) measured.push_back(&column);
  for (size_t k = 0; k < measured.size(); ++k) out << (k ? "," : "") << measured[k]->key << "_ms";
  out << "\n";
  size_t rows = 0;
  for (const auto* column : measured) rows = std::max(rows, column->samples_ms.size());
  for (size_t i = 0; i < rows; ++i) {
    for (size_t k = 0; k < measured.size(); ++k) {
      if (k) out << ",";
      if (i < measured[k]->samples_ms.size()) out << measured[k]->samples_ms[i];
    }
    out << "\n";
  }
  std::printf("  raw samples written to %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);

  auto backend = rlm::make_backend("docker");
  if (!backend) {
    std::printf("rlm-docker-bench: skipped, this build has no docker backend\n");
    return 0;
  }
  if (auto why = backend->unavailable_reason(); !why.empty()) {
    std::printf("rlm-docker-bench: skipped, no Docker daemon here: %s\n", why.c_str());
    return 0;
  }
  const rlm::Policy policy = bench_policy(options.image);
  rlm::Request true_request;
  true_request.argv = {"/bin/true"};
  // A missing image is a run that fails with Docker's answer in its detail.
  if (const auto tried = backend->run(true_request, policy); tried.status != rlm::Status::ok) {
    std::printf(
        "rlm-docker-bench: skipped, the docker backend cannot run /bin/true in %s: %s "
        "(tools/docker-env imports rlm-sandbox-test:busybox)\n",
        options.image.c_str(), tried.detail.c_str());
    return 0;
  }

  std::unique_ptr<rlm::Session> session;
  std::string no_session;
  try {
    session = backend->open_session(session_policy(options.image), {});
  } catch (const std::exception& error) {
    no_session = std::string("the session did not start: ") + error.what();
  }

  // docker exec's target: a container of Docker's own with the host's python3, removed at the end.
  const std::string exec_target = "rlm-docker-bench-" + std::to_string(getpid());
  const bool have_target = spawn_quietly({options.docker, "run", "-d", "--rm", "--network", "none",
                                          "--name", exec_target, "-v", "/usr:/usr:ro", "-v",
                                          "/lib:/lib:ro", "-v", "/lib64:/lib64:ro", options.image,
                                          "/bin/sh", "-c", "while :; do sleep 3600; done"});

  std::vector<Column> columns;
  columns.push_back({"docker backend one-shot (in process)",
                     "oneshot",
                     [&] {
                       const auto r = backend->run(true_request, policy);
                       return r.status == rlm::Status::ok;
                     },
                     "",
                     {},
                     0});
  columns.push_back({"rlm-sandbox run --backend docker (command)",
                     "cli",
                     [&] {
                       return spawn_quietly({options.rlm_sandbox, "run", "--backend", "docker",
                                             "--image", options.image, "--", "/bin/true"});
                     },
                     "",
                     {},
                     0});
  columns.push_back({"docker run --rm --network none (command)",
                     "docker_run",
                     [&] {
                       return spawn_quietly({options.docker, "run", "--rm", "--network", "none",
                                             options.image, "/bin/true"});
                     },
                     "",
                     {},
                     0});
  columns.push_back({"docker backend session cell (in process)",
                     "session",
                     [&] { return session->execute("pass").status == rlm::CellStatus::ok; },
                     no_session,
                     {},
                     0});
  columns.push_back(
      {"docker exec python3 -c pass (command)",
       "docker_exec",
       [&] {
         return spawn_quietly({options.docker, "exec", exec_target, "python3", "-c", "pass"});
       },
       have_target ? "" : "could not start a container to exec into",
       {},
       0});

  // A column whose first try fails is reported, not measured.
  for (auto& column : columns)
    if (column.unavailable.empty() && !column.once())
      column.unavailable =
          column.key == "cli" ? options.rlm_sandbox + " could not run it" : "the first try failed";

  std::vector<Column*> measured;
  for (auto& column : columns)
    if (column.unavailable.empty()) measured.push_back(&column);
  for (long i = 0; i < options.warmup; ++i)
    for (auto* column : measured) column->once();
  for (long round = 0; round < options.samples; ++round) {
    for (size_t k = 0; k < measured.size(); ++k) {
      Column* column = measured[(static_cast<size_t>(round) + k) % measured.size()];
      const auto start = Clock::now();
      const bool ok = column->once();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (ok)
        column->samples_ms.push_back(ms);
      else
        ++column->failures;
    }
  }

  if (session) session->close();
  if (have_target) spawn_quietly({options.docker, "rm", "-f", exec_target});
  print_table(columns, options);
  if (!options.csv.empty()) write_csv(columns, options.csv);
  return 0;
}
