#include "supervisor/init.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <utility>

#include <nlohmann/json.hpp>

#include "rlm_init/protocol.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "supervisor/supervise.hpp"

namespace rlm::supervisor {
namespace {

namespace protocol = init_protocol;

// ---- Where it is ----------------------------------------------------------------------------

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The file this code was loaded from: the shared library (librlm_sandbox.so) when a program links
// that, else the executable itself.
std::filesystem::path loaded_object() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&locate_init), &info) == 0 || info.dli_fname == nullptr)
    return {};
  std::error_code error;
  auto path = std::filesystem::canonical(info.dli_fname, error);
  return error ? std::filesystem::path() : path;
}

// Relative to the running program first (a build tree's bin/, where every executable lands next to
// rlm-sandbox-init; an installed bin/ with libexec/ beside it, wherever the prefix was moved), then
// relative to the shared library (an embedder's program anywhere, the library in PREFIX/lib or
// PREFIX/lib/<multiarch>), then the prefix the library was configured for. Never the build tree
// by its path: an installed copy must not pick up whatever a build directory holds.
std::vector<std::string> default_candidates() {
  std::vector<std::string> candidates;
  const auto add_near = [&candidates](const std::filesystem::path& dir) {
    candidates.push_back((dir / protocol::kBinaryName).string());
    candidates.push_back(
        (dir.parent_path() / "libexec/rlm-sandbox" / protocol::kBinaryName).string());
  };
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) add_near(self.parent_path());
  if (const auto library = loaded_object(); !library.empty() && library != self) {
    const auto dir = library.parent_path();
    candidates.push_back(
        (dir.parent_path() / "libexec/rlm-sandbox" / protocol::kBinaryName).string());
    candidates.push_back(
        (dir.parent_path().parent_path() / "libexec/rlm-sandbox" / protocol::kBinaryName).string());
  }
  candidates.push_back(RLM_SANDBOX_INIT_INSTALL_PATH);
  // Each path once, in order of first appearance, so the "looked for" message stays short.
  std::vector<std::string> unique;
  for (auto& candidate : candidates)
    if (std::find(unique.begin(), unique.end(), candidate) == unique.end())
      unique.push_back(std::move(candidate));
  return unique;
}

std::string rlimit_text(const ResourceLimit& limit) {
  return std::string(resource_name(limit.resource)) + "=" + std::to_string(limit.soft) + ":" +
         std::to_string(limit.hard);
}

// ---- Its report -----------------------------------------------------------------------------

int integer(const nlohmann::json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_number_integer() ? it->get<int>() : 0;
}

std::string text(const nlohmann::json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool flag(const nlohmann::json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_boolean() && it->get<bool>();
}

std::chrono::microseconds to_micro(const timeval& time) {
  return std::chrono::seconds(time.tv_sec) + std::chrono::microseconds(time.tv_usec);
}

std::string wait_status_text(const Supervision& supervision) {
  if (!supervision.reaped) return "its exit status was taken by another part of this process";
  const int status = supervision.wait_status;
  if (WIFSIGNALED(status)) return "killed by " + signal_name(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

// What a report that says the sandbox itself failed means, in words.
std::string setup_problem(const InitReport& report, const RunContext& context,
                          const Supervision& supervision) {
  using sys::errno_text;
  switch (report.kind) {
    case InitReport::Kind::setup_failed:
      if (report.step == "chdir")
        return "cannot enter the working directory '" + context.workdir +
               "': " + errno_text(report.value);
      if (report.step == "seccomp")
        return "cannot install the seccomp filter in the payload: " + errno_text(report.value);
      if (report.step == "fds")
        return "cannot give the payload its stdio and inherited fds: " + errno_text(report.value);
      if (report.step == "guard")
        return "cannot guard the payload's signals (a seccomp listener: refused when already "
               "inside a sandbox that uses one, or on kernels before 5.0): " +
               errno_text(report.value);
      return "cannot apply the " + report.path + " resource limit (" + report.step +
             "): " + errno_text(report.value);
    case InitReport::Kind::init_failed:
      return "rlm-sandbox-init failed: " + report.message;
    default:  // missing
      if (supervision.start_failure.failed()) {
        const std::string step = supervision.start_failure.step;
        return (step == "execve" ? "cannot execute rlm-sandbox-init at " + context.init_path
                                 : "cannot start rlm-sandbox-init (" + step + ")") +
               ": " + errno_text(supervision.start_failure.error);
      }
      return "rlm-sandbox-init (" + context.init_path + ") ended without a report (" +
             wait_status_text(supervision) + ")";
  }
}

Stop stop_of(StopReason reason) {
  switch (reason) {
    case StopReason::timeout:
      return Stop::timeout;
    case StopReason::output_limit:
      return Stop::output_limit;
    case StopReason::cancelled:
      return Stop::cancelled;
    case StopReason::caller_error:
      return Stop::caller_error;
    case StopReason::limit_reached:  // which limit is the asking backend's to say
    case StopReason::none:
      break;
  }
  return Stop::none;
}

}  // namespace

// ---- Where it is ----------------------------------------------------------------------------

std::string InitLocation::problem() const {
  if (!path.empty()) return "";
  std::string text = std::string(protocol::kBinaryName) + " not found (looked for";
  for (std::size_t i = 0; i < tried.size(); ++i) text += (i ? ", " : " ") + tried[i];
  return text + ")";
}

std::string InitLocation::fix() {
  return "build the rlm-sandbox-init target (it lands next to the rlm-sandbox binary), install "
         "rlm-sandbox (PREFIX/libexec/rlm-sandbox/rlm-sandbox-init), or set RLM_SANDBOX_INIT "
         "to the path of rlm-sandbox-init";
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

// ---- Its command line -----------------------------------------------------------------------

std::vector<std::string> init_arguments(const std::string& init_path, InitSettings settings) {
  std::vector<std::string> args{init_path, protocol::kReportFdFlag,
                                std::to_string(protocol::kReportFd), protocol::kGraceFlag,
                                std::to_string(settings.grace.count())};
  if (settings.await_fd >= 0) {
    for (int fd : {settings.seccomp_fd, settings.seccomp_notify_fd}) {
      if (fd < 0) continue;
      args.push_back(fd == settings.seccomp_fd ? protocol::kSeccompFdFlag
                                               : protocol::kSeccompNotifyFdFlag);
      args.push_back(std::to_string(fd));
    }
    if (settings.pid1) args.push_back(protocol::kPid1Flag);
    if (settings.hold_after_report) args.push_back(protocol::kHoldAfterReportFlag);
    args.push_back(protocol::kAwaitPayloadFlag);
    args.push_back(std::to_string(settings.await_fd));
    return args;
  }
  for (const auto& limit : settings.rlimits) {
    args.push_back(protocol::kRlimitFlag);
    args.push_back(rlimit_text(limit));
  }
  if (!settings.workdir.empty()) {
    args.push_back(protocol::kChdirFlag);
    args.push_back(settings.workdir);
  }
  if (settings.seccomp_fd >= 0) {
    args.push_back(protocol::kSeccompFdFlag);
    args.push_back(std::to_string(settings.seccomp_fd));
  }
  if (settings.seccomp_notify_fd >= 0) {
    args.push_back(protocol::kSeccompNotifyFdFlag);
    args.push_back(std::to_string(settings.seccomp_notify_fd));
  }
  if (settings.guard_signals) args.push_back(protocol::kGuardSignalsFlag);
  if (settings.pid1) args.push_back(protocol::kPid1Flag);
  args.push_back("--");
  args.insert(args.end(), std::make_move_iterator(settings.payload_argv.begin()),
              std::make_move_iterator(settings.payload_argv.end()));
  return args;
}

// ---- Await mode's payload message -------------------------------------------------------------

std::string encode_payload_message(const PayloadMessage& message) {
  if (message.argv.empty()) throw Error("the payload message needs a command");
  if (message.rlimits.size() > protocol::kPayloadMaxLimits ||
      message.inherit_fds.size() > protocol::kPayloadMaxInherited)
    throw Error("the payload message has too many rlimits or inherited fds");
  if (message.argv.size() + message.environment.size() > protocol::kPayloadMaxStrings)
    throw Error("the payload's command line and environment have too many strings");
  std::string body;
  const auto add = [&body](std::string_view text, const char* what) {
    if (text.find('\0') != std::string_view::npos)
      throw Error(std::string("the payload's ") + what + " holds a NUL byte");
    body.append(text);
    body.push_back('\0');
  };
  add(message.workdir, "working directory");
  for (const auto& limit : message.rlimits) add(rlimit_text(limit), "rlimit");
  for (int fd : message.inherit_fds) add(std::to_string(fd), "inherited fd");
  for (const auto& arg : message.argv) add(arg, "command line");
  for (const auto& entry : message.environment) add(entry, "environment");
  if (body.size() > protocol::kPayloadMaxBodyBytes)
    throw Error("the payload's command line and environment exceed " +
                std::to_string(protocol::kPayloadMaxBodyBytes) + " bytes");

  const bool stdio = message.stdio[0] >= 0;
  const std::uint32_t grace = static_cast<std::uint32_t>(
      std::clamp<long long>(message.grace.count(), 0, protocol::kPayloadMaxGraceMs));
  const std::uint32_t header[protocol::kPayloadHeaderWords] = {
      protocol::kPayloadMagic,
      static_cast<std::uint32_t>(body.size()),
      static_cast<std::uint32_t>(message.argv.size()),
      static_cast<std::uint32_t>(message.environment.size()),
      static_cast<std::uint32_t>(message.rlimits.size()),
      static_cast<std::uint32_t>(message.inherit_fds.size()),
      (message.guard_signals ? protocol::kPayloadGuardSignals : 0u) |
          (stdio ? protocol::kPayloadStdio : 0u),
      grace,
  };
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  return bytes + body;
}

void send_payload_message(int socket, const PayloadMessage& message,
                          std::chrono::steady_clock::time_point deadline) {
  const std::string bytes = encode_payload_message(message);
  std::vector<int> fds;
  if (message.stdio[0] >= 0) fds.assign(message.stdio.begin(), message.stdio.end());
  fds.insert(fds.end(), message.inherit_fds.begin(), message.inherit_fds.end());

  std::size_t sent = 0;
  while (sent < bytes.size()) {
    // The fds ride on the first bytes only.
    const std::span<const int> attached =
        sent == 0 ? std::span<const int>(fds) : std::span<const int>();
    const long count =
        sys::send_with_fds(socket, std::string_view(bytes).substr(sent), attached, MSG_DONTWAIT);
    if (count > 0) {
      sent += static_cast<std::size_t>(count);
      continue;
    }
    if (count < 0 && errno == EAGAIN) {
      pollfd room{socket, POLLOUT, 0};
      const int ready = poll(&room, 1, sys::poll_timeout_ms(deadline));
      if (ready == 0) throw Error("rlm-sandbox-init did not take its payload in time");
      continue;
    }
    throw Error("cannot hand rlm-sandbox-init its payload: " + sys::errno_text(errno));
  }
}

// ---- Its report -----------------------------------------------------------------------------

InitReport parse_init_report(std::string_view line) {
  InitReport report;
  const auto newline = line.find('\n');
  const auto document = nlohmann::json::parse(line.substr(0, newline), nullptr, false);
  if (!document.is_object()) return report;

  // The first of these keys the report holds says how the run ended; its value is an integer,
  // but for init's own error message.
  constexpr std::pair<const char*, InitReport::Kind> kEndings[] = {
      {protocol::kExitCodeKey, InitReport::Kind::exited},
      {protocol::kSignalKey, InitReport::Kind::signaled},
      {protocol::kExecErrnoKey, InitReport::Kind::exec_failed},
      {protocol::kSetupErrnoKey, InitReport::Kind::setup_failed},
      {protocol::kInitErrorKey, InitReport::Kind::init_failed},
  };
  for (const auto& [key, kind] : kEndings) {
    if (!document.contains(key)) continue;
    report.kind = kind;
    if (kind == InitReport::Kind::init_failed)
      report.message = text(document, key);
    else
      report.value = integer(document, key);
    break;
  }
  if (const auto cpu = document.find(protocol::kCpuKey);
      cpu != document.end() && cpu->is_number_integer())
    report.cpu = std::chrono::microseconds(cpu->get<long long>());
  report.step = text(document, protocol::kStepKey);
  report.path = text(document, protocol::kPathKey);
  report.terminated = flag(document, protocol::kTerminatedKey);
  report.terminated_by_payload = flag(document, protocol::kTerminatedByPayloadKey);
  if (const auto violation = document.find(protocol::kSeccompViolationKey);
      violation != document.end() && violation->is_number_integer())
    report.seccomp_syscall = violation->get<int>();
  return report;
}

RunContext run_context(const Policy& policy, std::string argv0, std::string workdir,
                       std::string init_path, std::chrono::milliseconds wall_limit) {
  RunContext context;
  context.argv0 = std::move(argv0);
  context.workdir = std::move(workdir);
  context.init_path = std::move(init_path);
  context.limits = policy.limits;
  context.wall_limit = wall_limit;
  return context;
}

RunEnd init_run_end(Supervision supervision, const RunContext& context) {
  if (supervision.caller_error) std::rethrow_exception(supervision.caller_error);
  const InitReport report = parse_init_report(supervision.report);
  RunEnd end;
  set_limits(end, context.limits, context.wall_limit);
  end.stop = stop_of(supervision.stop);
  end.init_killed = supervision.init_killed;
  end.stdout_data = std::move(supervision.stdout_data);
  end.stderr_data = std::move(supervision.stderr_data);
  end.stdout_truncated = supervision.stdout_truncated;
  end.stderr_truncated = supervision.stderr_truncated;
  if (supervision.reaped) {
    // wait4 on init covers init and every descendant it reaped: the whole tree. ru_maxrss is the
    // largest single process, not a sum.
    end.tree_cpu = to_micro(supervision.usage.ru_utime) + to_micro(supervision.usage.ru_stime);
    end.tree_peak_memory = static_cast<std::uint64_t>(supervision.usage.ru_maxrss) * 1024;
  }

  end.payload_cpu = report.cpu;
  end.terminated = report.terminated;
  end.terminated_by_payload = report.terminated_by_payload;
  end.seccomp_syscall = report.seccomp_syscall;
  switch (report.kind) {
    case InitReport::Kind::exited:
      end.ending = Ending::exited;
      end.exit_code = report.value;
      break;
    case InitReport::Kind::signaled:
      end.ending = Ending::signaled;
      end.signal = report.value;
      break;
    case InitReport::Kind::exec_failed:
      end.ending = Ending::cannot_execute;
      end.exit_code = report.value == ENOENT ? 127 : 126;
      end.command = context.argv0;
      end.problem = sys::errno_text(report.value);
      break;
    default:
      end.ending = Ending::setup_failed;
      end.problem = setup_problem(report, context, supervision);
      break;
  }
  return end;
}

}  // namespace rlm::supervisor
