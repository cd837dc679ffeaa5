// ServerConnection::run: the payload's stdio as pipes this process reads, capped as a direct run
// caps them; the server only starts and stops the sandbox.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <array>
#include <memory>

#include "host/stdio_pipe.hpp"
#include "rlm_sandbox/units.hpp"
#include "rlm_sys/sys.hpp"
#include "server/client_state.hpp"
#include "supervisor/payload_io.hpp"

namespace rlm {

using host::UniqueFd;
using nlohmann::json;
using server::Clock;
using supervisor::CappedOutput;

namespace {

struct Pipe {
  UniqueFd read, write;
};

Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("pipe2: " + sys::errno_text(errno));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// A stdin that may go to the payload as it is: a regular file, /dev/null. A pipe, a terminal or
// anything else is pumped through a pipe of our own, so the sandbox never holds the caller's: a
// pipe it could open by path (/dev/stdin, which our own pipes allow: host/stdio_pipe.hpp) would
// let it write into the caller's input, which the caller's next reader takes (found by attacking
// it: `... | while read` then read a line the payload chose).
bool stdin_passable(int fd) {
  struct stat status {};
  if (fstat(fd, &status) != 0) return false;
  if (S_ISREG(status.st_mode)) return true;
  return S_ISCHR(status.st_mode) && major(status.st_rdev) == 1 && minor(status.st_rdev) == 3;
}

json request_json(const Request& request) {
  json body = json::object();
  if (!request.argv.empty()) {
    body["argv"] = request.argv;
  } else {
    body["code"] = request.code;
    body["language"] = request.language;
  }
  if (!request.env.empty()) body["env"] = request.env;
  if (request.timeout) body["timeout_ms"] = request.timeout->count();
  return body;
}

}  // namespace

Result ServerConnection::run(const Request& request, const std::string& policy_name,
                             const Policy* overrides) {
  const int socket = state_->socket.get();
  json frame{{"op", "run"}, {"policy", policy_name}, {"request", request_json(request)}};
  if (overrides) frame["overrides"] = overrides->to_json();

  const bool caller_stdio = request.payload_stdio[0] >= 0 && request.payload_stdio[1] >= 0 &&
                            request.payload_stdio[2] >= 0;
  Pipe out, err, in;
  UniqueFd devnull;
  std::array<int, 3> stdio = request.payload_stdio;
  std::optional<supervisor::StdinPump> pump;
  if (!caller_stdio) {
    out = make_pipe();
    err = make_pipe();
    if (request.stdin_fd >= 0 && stdin_passable(request.stdin_fd)) {
      stdio[0] = request.stdin_fd;
    } else if (request.stdin_fd >= 0 || !request.stdin_data.empty()) {
      in = make_pipe();
      fcntl(in.write.get(), F_SETFL, O_NONBLOCK);
      stdio[0] = in.read.get();
      pump.emplace(std::move(in.write), request.stdin_data, request.stdin_fd);
    } else {
      devnull = UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
      stdio[0] = devnull.get();
    }
    stdio[1] = out.write.get();
    stdio[2] = err.write.get();
    // The payload may open them by path (/dev/stdout), under the server's sandbox uid: ours only
    // (stdin is ours too, or a file or /dev/null, which this leaves alone).
    for (const int fd : stdio) host::open_pipe_to_its_holders(fd);
  }
  server::send_to_server(socket, frame, stdio);
  // Only the payload holds the write ends now: EOF on them is the payload's end.
  out.write.reset();
  err.write.reset();
  in.read.reset();
  devnull.reset();

  const json started = server::server_reply(socket, Clock::now() + server::kReplyTimeout);
  // Before "started" nothing ran: a node that answers out of turn is one not to use (a fleet
  // passes it over, as one that does not answer), never a reason to give up the run.
  if (started["op"] != "started")
    throw ServerRefused("unavailable", "the server answered out of turn (nothing ran)");
  const json cap_json = started.value("output_bytes", json());
  const std::uint64_t cap = cap_json.is_number_unsigned() ? cap_json.get<std::uint64_t>() : 0;

  std::string kept_out, kept_err;
  CappedOutput capped_out(cap, request.on_stdout, kept_out);
  CappedOutput capped_err(cap, request.on_stderr, kept_err);
  bool stop_sent = false;
  const auto stop_for = [&](const char* stream) {
    if (stop_sent) return;
    stop_sent = true;
    try {
      server::send_frame(socket, {{"op", "stop"}, {"reason", "output_limit"}, {"stream", stream}},
                         Clock::now() + std::chrono::seconds(5));
    } catch (const Error&) {  // the run is over already
    }
  };
  // Not cleared: only what read() returns is ever used (64 KiB of memset per run was measurable).
  constexpr std::size_t kChunk = 1u << 16;
  const auto chunk = std::make_unique_for_overwrite<char[]>(kChunk);
  const auto drain = [&](UniqueFd& pipe, CappedOutput& output, const char* stream) {
    const ssize_t got = read(pipe.get(), chunk.get(), kChunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (got <= 0) return pipe.reset();
    if (output.accept({chunk.get(), static_cast<std::size_t>(got)})) stop_for(stream);
  };

  // Nonblocking, so that once the Result is in, what the pipes hold is read without waiting for
  // their EOF: every process of the sandbox is dead by then (the server reports a run after its
  // PID 1 is reaped), so nothing more can come, and EOF itself may wait for the server to
  // dispose of the used sandbox off its critical path.
  for (const auto* pipe : {&out.read, &err.read})
    if (*pipe) fcntl(pipe->get(), F_SETFL, O_NONBLOCK);
  std::optional<Result> result;
  // The caller's stop (Request::stop_fd readable) goes to the server once; the run then ends as
  // `interrupted`, the payload given SIGTERM and its grace there.
  bool interrupt_sent = false;
  while (!result || out.read || err.read) {
    const int stop_fd = result || interrupt_sent ? -1 : request.stop_fd;
    pollfd fds[6] = {{result ? -1 : socket, POLLIN, 0},
                     {out.read.get(), POLLIN, 0},
                     {err.read.get(), POLLIN, 0},
                     {pump ? pump->write_fd() : -1, POLLOUT, 0},
                     {pump ? pump->read_fd() : -1, POLLIN, 0},
                     {stop_fd, POLLIN, 0}};
    const int timeout = result ? 0 : -1;
    const int ready = poll(fds, 6, timeout);
    if (ready < 0 && errno != EINTR) throw Error("poll: " + sys::errno_text(errno));
    if (ready == 0 && result) break;  // the pipes are drained
    constexpr short kReady = POLLIN | POLLHUP | POLLERR;
    if (fds[1].revents & kReady) drain(out.read, capped_out, "stdout");
    if (fds[2].revents & kReady) drain(err.read, capped_err, "stderr");
    if (fds[3].revents & (POLLOUT | POLLERR | POLLHUP)) pump->on_writable();
    if (fds[4].revents & kReady) pump->on_readable();
    if (fds[5].revents & kReady) {
      interrupt_sent = true;
      stop_sent = true;  // the first stop is the one the server acts on
      try {
        server::send_frame(socket, {{"op", "stop"}, {"reason", "interrupted"}},
                           Clock::now() + std::chrono::seconds(5));
      } catch (const Error&) {  // the run is over already
      }
    }
    if (fds[0].revents & kReady) {
      json reply;
      try {
        reply = server::server_reply(socket, Clock::now() + server::kReplyTimeout);
      } catch (const server::ConnectionLost& lost) {
        // Gone after the run started: the payload may have run, so this is no refusal to take
        // elsewhere (a fleet passes over "unavailable" nodes) but the node's loss.
        const ServerRefused& refused = lost;
        throw ServerRefused("node_lost", std::string("node_lost: the server went away while the "
                                                     "run was going (") +
                                             refused.what() + ")");
      }
      if (reply["op"] != "result" || !reply.contains("result"))
        throw ServerRefused("internal", "the server answered out of turn");
      result = result_from_json(reply["result"]);
      if (pump) pump->close();
    }
  }
  if (!caller_stdio) {
    result->stdout_data = std::move(kept_out);
    result->stderr_data = std::move(kept_err);
    result->stdout_truncated = result->stdout_truncated || capped_out.truncated();
    result->stderr_truncated = result->stderr_truncated || capped_err.truncated();
    // Output over the cap ends the run as output_limit, however the payload ended after it.
    if ((capped_out.truncated() || capped_err.truncated()) &&
        result->status != Status::output_limit && result->status != Status::sandbox_error) {
      result->status = Status::output_limit;
      result->detail = std::string(capped_out.truncated() ? "stdout" : "stderr") +
                       " exceeded the output limit of " + format_size(cap);
    }
  }
  return std::move(*result);
}

}  // namespace rlm
