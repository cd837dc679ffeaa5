// The repl engine (rlm_sandbox/repl.hpp): a reader thread takes the orchestrator's lines, so
// `llm_result` answers arrive while a cell runs; everything else is done in order on the calling
// thread.
#include "rlm_sandbox/repl.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "repl/request.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "session/pending_calls.hpp"

namespace rlm {
namespace {

using nlohmann::json;
using repl::ReplInputLimits;
using repl::ReplOp;
using repl::ReplRequest;

// One line per event, whole lines only, from any thread.
class Output {
 public:
  explicit Output(int fd) : fd_(fd) {}

  void line(const json& message) {
    const auto text = message.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard lock(mutex_);
    for (std::size_t written = 0; written < text.size();) {
      // Never SIGPIPE: an orchestrator that stops reading must not kill the process embedding us.
      const long n = sys::write_without_sigpipe(fd_, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the orchestrator stopped reading: nothing more can reach it
      written += static_cast<std::size_t>(n);
    }
  }

 private:
  const int fd_;
  std::mutex mutex_;
};

// The orchestrator as the LM: each query becomes an llm_query event; its llm_result line
// completes it.
class OrchestratorHandler final : public LlmHandler {
 public:
  OrchestratorHandler(Output& output, std::string bulk_dir)
      : output_(output), bulk_dir_(std::move(bulk_dir)) {}

  // answer() writes the call out and returns; its answer comes back later.
  bool hands_calls_on() const override { return true; }

  void set_current_request(json id) {
    std::lock_guard lock(mutex_);
    current_ = std::move(id);
  }

  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    const auto query_id = calls_.add(call, std::move(done));
    if (!query_id) return;
    json event;
    {
      std::lock_guard lock(mutex_);
      event = {{"id", current_},
               {"event", "llm_query"},
               {"query_id", *query_id},
               {"model", call.model ? json(*call.model) : json()},
               {"kind", to_string(call.kind)}};
    }
    if (auto file = bulk_file(call, *query_id)) {
      event["prompt_file"] = std::move(*file);
      event["prompt_bytes"] = call.prompt.size();
    } else {
      event["prompt"] = prompt_of(call);
    }
    if (call.kind == CallKind::tool) event["tool"] = std::move(call.tool);
    output_.line(event);
  }

  // A checked llm_result line; returns an error message when no call waits for it, or when its
  // kind of answer does not fit the call (the call still waits then).
  std::string complete(const ReplRequest& line) {
    std::string problem;
    const bool waiting = calls_.complete(line.query_id, [&](bool tool) -> std::optional<LlmAnswer> {
      if (line.value && !tool) {
        problem = "query " + std::to_string(line.query_id) +
                  " is no tool call: answer it with \"text\" or \"error\"";
        return std::nullopt;
      }
      if (line.error) return LlmAnswer::of_error(*line.error);
      if (tool)  // a tool's answer is JSON text; "text" answers it with that string
        return LlmAnswer::of_text((line.value ? *line.value : json(*line.text))
                                      .dump(-1, ' ', false, json::error_handler_t::replace));
      return LlmAnswer::of_text(*line.text);
    });
    if (!waiting) return "no llm_query is waiting with query_id " + std::to_string(line.query_id);
    return problem;
  }

  void close() { calls_.close(); }

 private:
  // The path of a new file in the bulk directory holding a large text prompt, or nullopt (no
  // such directory, a small or JSON prompt, or the file could not be made: then it goes inline).
  // The prompt is the sandbox's bytes, written as data; the directory is the orchestrator's own.
  std::optional<std::string> bulk_file(const LlmCall& call, std::uint64_t query_id) const {
    if (bulk_dir_.empty() || call.prompt_is_json || call.prompt.size() <= kReplBulkPromptBytes)
      return std::nullopt;
    std::string path = bulk_dir_ + "/prompt-" + std::to_string(query_id);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return std::nullopt;
    bool written = true;
    for (std::size_t done = 0; written && done < call.prompt.size();) {
      const ssize_t n = write(fd, call.prompt.data() + done, call.prompt.size() - done);
      if (n < 0 && errno == EINTR) continue;
      written = n > 0;
      if (written) done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    if (!written) {
      unlink(path.c_str());
      return std::nullopt;
    }
    return path;
  }

  // The prompt as the event shows it: a string, or the message list or tool arguments the
  // session checked and wrote as JSON (at most 64 levels deep: parsing and printing it is safe).
  static json prompt_of(LlmCall& call) {
    if (!call.prompt_is_json) return std::move(call.prompt);
    json value = json::parse(call.prompt, nullptr, /*allow_exceptions=*/false);
    return value.is_discarded() ? json(std::move(call.prompt)) : value;
  }

  Output& output_;
  const std::string bulk_dir_;
  session::PendingCalls calls_{"the orchestrator closed its input"};
  std::mutex mutex_;
  json current_;
};

// Requests other than llm_result, in order; nullopt once the input has ended. Bounded by count and
// by the bytes of their lines. When full, push() waits for room if `wait` (the reader then stops
// reading: backpressure on the orchestrator's pipe), else refuses the request: the reader must not
// stop while llm_result lines may be waiting behind it. Once stopped, push() drops what it gets.
class RequestQueue {
 public:
  static constexpr std::size_t kMaxRequests = 256;
  static constexpr std::size_t kMaxBytes = 4 * repl::kMaxReplLineBytes;

  bool push(std::optional<ReplRequest> request, std::size_t line_bytes = 0, bool wait = false) {
    {
      std::unique_lock lock(mutex_);
      const auto full = [&] {
        return requests_.size() >= kMaxRequests || bytes_ + line_bytes > kMaxBytes;
      };
      if (request && wait) room_.wait(lock, [&] { return stopped_ || !full(); });
      if (stopped_) return true;
      if (request && full()) return false;
      bytes_ += line_bytes;
      requests_.push_back({std::move(request), line_bytes});
    }
    ready_.notify_one();
    return true;
  }
  std::optional<ReplRequest> pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !requests_.empty(); });
    auto [request, line_bytes] = std::move(requests_.front());
    requests_.pop_front();
    bytes_ -= line_bytes;
    lock.unlock();
    room_.notify_one();
    return std::move(request);
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    room_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<std::pair<std::optional<ReplRequest>, std::size_t>> requests_;
  std::size_t bytes_ = 0;
  bool stopped_ = false;
};

json error_line(const json& id, const std::string& message) {
  return {{"id", id}, {"error", message}};
}

// add_context or add_history: text stays text (unless "json" says it is JSON text), any other
// value crosses as its JSON; a file crosses as an fd.
CellResult add_context(Session& session, const ReplRequest& request) {
  ContextInput input;
  const json& value = request.context;  // depth-bounded: dumping it is safe
  input.is_json = request.context_json;
  if (!request.context_file.empty()) {
    input.file = request.context_file;
  } else if (value.is_string()) {
    input.data = value.get<std::string>();
  } else {
    input.data = value.dump(-1, ' ', false, json::error_handler_t::replace);
    input.is_json = true;
  }
  std::optional<std::size_t> index;
  if (request.index) index = static_cast<std::size_t>(*request.index);
  const auto kind = request.op == ReplOp::add_history ? ContextKind::history : ContextKind::context;
  return session.add_context(kind, input, index);
}

// Does one checked request; returns false after close.
bool serve(Session& session, OrchestratorHandler* orchestrator, const ReplRequest& request,
           Output& output) {
  const json& id = request.id;  // a scalar: safe to echo
  try {
    switch (request.op) {
      case ReplOp::execute: {
        if (orchestrator) orchestrator->set_current_request(id);
        ExecuteOptions options;
        options.timeout = request.timeout;
        options.locals = request.locals;
        options.fetch = request.fetch;
        const auto cell = session.execute(request.code, options);
        output.line({{"id", id}, {"result", cell.to_json()}});
        break;
      }
      case ReplOp::add_context:
      case ReplOp::add_history: {
        if (orchestrator) orchestrator->set_current_request(id);
        const auto cell = add_context(session, request);
        output.line({{"id", id}, {"result", cell.to_json()}});
        break;
      }
      case ReplOp::snapshot:
        output.line({{"id", id}, {"result", {{"snapshot", session.snapshot()}}}});
        break;
      case ReplOp::restore:
        session.restore(request.snapshot);
        output.line({{"id", id}, {"result", {{"restored", request.snapshot}}}});
        break;
      case ReplOp::save:
      case ReplOp::load: {
        if (orchestrator) orchestrator->set_current_request(id);
        const auto cell =
            request.op == ReplOp::save ? session.save(request.path) : session.load(request.path);
        output.line({{"id", id}, {"result", cell.to_json()}});
        break;
      }
      case ReplOp::narrow_network:
        session.narrow_network(request.allow);
        output.line({{"id", id}, {"result", {{"narrowed", request.allow}}}});
        break;
      case ReplOp::close:
        output.line({{"id", id}, {"result", session.close().to_json()}});
        return false;
      case ReplOp::context:
        throw Error("the context can only be given as the first line, and not with --context");
      case ReplOp::llm_result:  // answered by the reader
        break;
    }
  } catch (const std::exception& error) {
    output.line(error_line(id, error.what()));
  }
  return true;
}

// The reader thread: the orchestrator's lines from `in_fd`, each checked; llm_result answered at
// once, every other request queued for the serving thread, every bad line answered with one
// error. Ends at the end of the input, or once `stop_fd` is readable (the session is done).
class Reader {
 public:
  Reader(int in_fd, Output& output, RequestQueue& requests, OrchestratorHandler* orchestrator,
         const ReplInputLimits& limits, bool context_allowed)
      : in_fd_(in_fd),
        // Asked before the eventfd exists: a closed input's number would be the eventfd's, and
        // the reader would wait on its own stop signal as its input for ever.
        input_open_(fcntl(in_fd, F_GETFD) >= 0),
        stop_fd_(eventfd(0, EFD_CLOEXEC)),
        output_(output),
        requests_(requests),
        orchestrator_(orchestrator),
        limits_(limits) {
    if (stop_fd_ < 0) throw Error("eventfd: " + sys::errno_text(errno));
    thread_ = std::thread([this, context_allowed] {
      read_requests(context_allowed);
      if (orchestrator_) orchestrator_->close();
      requests_.push(std::nullopt);
    });
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  ~Reader() { stop(); }

  // Reads no further line, and returns once the thread has ended.
  void stop() {
    if (!thread_.joinable()) return;
    stopping_ = true;
    const std::uint64_t one = 1;
    while (write(stop_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    requests_.stop();
    thread_.join();
    close(stop_fd_);
  }

 private:
  void read_requests(bool context_allowed);

  const int in_fd_;
  const bool input_open_;  // a closed input is the end of the input
  const int stop_fd_;
  Output& output_;
  RequestQueue& requests_;
  OrchestratorHandler* const orchestrator_;
  const ReplInputLimits limits_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

void Reader::read_requests(bool context_allowed) {
  Output& output = output_;
  RequestQueue& requests = requests_;
  OrchestratorHandler* const orchestrator = orchestrator_;
  const ReplInputLimits& limits = limits_;
  const auto on_line = [&](std::string_view text, bool overlong) {
    if (stopping_) return;
    try {
      if (overlong)
        return output.line(error_line(json(), repl::overlong_line_message(limits.max_line_bytes)));
      if (repl::blank_line(text)) return;
      auto parsed = repl::parse_repl_request(text, limits);
      if (auto* error = std::get_if<repl::ReplRequestError>(&parsed))
        return output.line(error_line(error->id, error->message));
      auto& request = std::get<ReplRequest>(parsed);
      if (request.op == ReplOp::llm_result) {
        if (!orchestrator)
          output.line(
              error_line(request.id, "llm_result without a pending llm_query (--lm is set)"));
        else if (auto problem = orchestrator->complete(request); !problem.empty())
          output.line(error_line(request.id, problem));
        return;
      }
      // Only the first request may be the context: no other parsed context is ever held.
      if (request.op == ReplOp::context && !context_allowed)
        return output.line(error_line(
            request.id, "the context can only be given as the first line, and not with --context"));
      const json id = request.id;
      // With an LM handler nothing the reader has yet to read can unblock a running cell, so it
      // may wait for room; the orchestrator's llm_result lines must never wait behind a request.
      if (!requests.push(std::move(request), text.size(), /*wait=*/orchestrator == nullptr))
        return output.line(
            error_line(id, "too many requests are waiting (at most " +
                               std::to_string(RequestQueue::kMaxRequests) + ", " +
                               std::to_string(RequestQueue::kMaxBytes >> 20) +
                               " MiB of lines); send it again once some are answered"));
      context_allowed = false;
    } catch (const std::exception& error) {  // e.g. bad_alloc: this line fails, not the repl
      output.line(error_line(json(), std::string("the line could not be read: ") + error.what()));
    }
  };
  repl::LineSplitter splitter(limits.max_line_bytes);
  std::string chunk(1 << 16, '\0');
  while (input_open_ && !stopping_) {
    pollfd fds[2] = {{in_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) return;
    const ssize_t got = read(in_fd_, chunk.data(), chunk.size());
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) break;
    splitter.feed(std::string_view(chunk.data(), static_cast<std::size_t>(got)), on_line);
  }
  splitter.finish(on_line);
}

}  // namespace

void serve_repl(ReplOptions options, int in_fd, int out_fd) {
  if (!options.open_session) throw Error("serve_repl: no way to open the session");
  // Checked before anything here opens an fd, which could take a closed output's number.
  if (fcntl(out_fd, F_GETFD) < 0) throw Error("serve_repl: the output fd is not open");
  SessionOptions& session_options = options.session;
  Output output(out_fd);
  RequestQueue requests;
  std::shared_ptr<OrchestratorHandler> orchestrator;
  if (!session_options.llm) {
    orchestrator = std::make_shared<OrchestratorHandler>(output, options.bulk_dir);
    session_options.llm = orchestrator;
  }

  ReplInputLimits input_limits;
  input_limits.max_timeout = options.max_timeout;
  Reader reader(in_fd, output, requests, orchestrator.get(), input_limits,
                /*context_allowed=*/session_options.context_file.empty());

  // Without a context file the first line may carry the context, so the session opens once it
  // is read; with one it opens (and says ready) at once.
  std::optional<ReplRequest> first;
  bool have_first = false;
  if (session_options.context_file.empty()) {
    first = requests.pop();
    have_first = true;
    if (first && first->op == ReplOp::context) {
      const json& context = first->context;  // depth-bounded: dumping it is safe
      if (context.is_string() && !session_options.context_is_json) {
        session_options.context = context.get<std::string>();
      } else {
        session_options.context = context.dump(-1, ' ', false, json::error_handler_t::replace);
        session_options.context_is_json = true;
      }
      have_first = false;
    }
  }

  const std::unique_ptr<Session> session = options.open_session(std::move(session_options));
  output.line(
      {{"event", "ready"}, {"backend", session->backend()}, {"policy", options.policy_name}});

  auto request = have_first ? std::move(first) : requests.pop();
  for (; request; request = requests.pop())
    if (!serve(*session, orchestrator.get(), *request, output)) break;
  session->close();
  reader.stop();
}

std::vector<ToolSpec> repl_tools_from_text(std::string_view text) {
  if (auto problem = repl::json_shape_problem(text, repl::ReplInputLimits{}); !problem.empty())
    throw Error(problem);
  const json tools = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded()) throw Error("not valid JSON");
  return tools_from_json(tools);
}

}  // namespace rlm
