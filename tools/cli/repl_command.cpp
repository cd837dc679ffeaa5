// `rlm-sandbox repl`: a persistent sandboxed Python session driven over JSON lines on
// stdin/stdout (DESIGN.md §8, docs/sessions.md). A reader thread takes the orchestrator's lines,
// so `llm_result` answers arrive while a cell runs; everything else is done in order on the main
// thread.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cli.hpp"
#include "limit_flags.hpp"
#include "repl_request.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace rlm::cli {
namespace {

constexpr const char* kUsage = R"text(usage: rlm-sandbox repl [OPTIONS]

A persistent Python REPL in a sandbox, driven by JSON lines: one request per line on stdin, one
event or answer per line on stdout. Variables, functions and imports persist from cell to cell.
A cell that times out, hits the memory limit or kills the interpreter is rolled back: the session
goes on with the state from before it ("rolled_back": true).

in:   {"id": 1, "op": "execute", "code": "x = 41", "timeout_ms": 5000}
            optional: "locals": true (list the variables), "fetch": "x" (x's value, as JSON)
      {"op": "llm_result", "query_id": 7, "text": "..."}       (or "error": "...")
            a tool call is answered with "value": <any JSON> (its return value) or "error"
      {"id": 2, "op": "add_context", "context": "text or any JSON", "index": 1}
            or "context_file": "path"; "json": true parses the text or the file as JSON; the
            index is optional (the next free one); sets context_N (and context for 0)
      {"id": 3, "op": "add_history", "history": [{"role": "user", "content": "..."}]}
            sets history_N (and history for 0); "index" as for add_context
      {"id": 4, "op": "snapshot"}     {"id": 5, "op": "restore", "snapshot": 1}
      {"id": 6, "op": "close"}
      {"op": "context", "context": "..."}   as the first request, when --context is not given
out:  {"event": "ready", "backend": "namespace", "policy": "python-repl"}
            (at once with --context; otherwise after the first request, which may be the context)
      {"id": 1, "event": "llm_query", "query_id": 7, "prompt": "...", "model": null,
       "kind": "llm"}
            (only without --lm: the orchestrator answers it with llm_result). "prompt" is a
            string or a message list [{"role", "content"}...]; "kind" is "llm" (llm_query),
            "rlm" (rlm_query) or "tool" (then "tool" names it and "prompt" is
            {"args": [...], "kwargs": {...}})
      {"id": 1, "result": {"status", "stdout", "stderr", "final", "wall_ms", "cpu_ms",
                           "llm_calls", "rolled_back", ...}}
            and when set: "answer" (answer["content"] once answer["ready"] was set), "locals"
            ([{"name", "type", "repr"}...]), "fetched" ({"value"} or {"error"}), "index"
            (add_context, add_history)
      {"id": 9, "error": "..."}       for a request that could not be done

Each line is checked before it is done: a line longer than 16 MiB (16777216 bytes; a large
context goes in --context FILE), nesting arrays and objects more than 64 deep, holding more than
262144 values (brackets and commas), not a JSON object, with a key its op does not take, or with
a field of the wrong type or range gets exactly one error line, and the repl goes on. "id": a
string (at most 1024 bytes), an integer or null, echoed in every line about the request (null in
the error when the line has no usable id); "timeout_ms": an integer from 1 to the policy's
limits.wall_time_ms; "query_id", "snapshot": the non-negative integers the repl gave out;
"index": a non-negative integer; "fetch": a name of at most 1024 bytes. At
most 256 requests (64 MiB of lines) wait behind a running one; beyond that the repl stops
reading stdin until one is done (with --lm) or refuses the request (without: llm_result lines
must not wait behind it).

Inside the sandbox: context (context_0, ...), history (history_0, ...), answer,
llm_query(prompt, model=None), llm_query_batched(prompts, model=None), rlm_query(prompt,
model=None), rlm_query_batched(prompts, model=None), FINAL(value), FINAL_VAR(name),
SHOW_VARS(), and the --tools: a tool with a "value" is that value; one without is a function
whose calls the orchestrator answers (kind "tool"). They are restored after every cell.

LM commands (--lm command:CMD) run on the host under a guard: whatever a call leaves running is
killed when its shell exits, and every call's processes die with the repl, SIGKILL included.

exit status: 0 after close or the end of stdin; 125 the session could not start; 2 bad usage.
)text";

constexpr const char* kExamples = R"text(
examples:
  echo '{"id":1,"op":"execute","code":"print(len(context))"}' |
      rlm-sandbox repl --context prompt.txt --lm echo
  rlm-sandbox repl --policy python-repl --lm 'command:./ask-model.sh' --timeout 30s
  rlm-sandbox repl --no-echo --tools '[{"name": "lookup", "description": "find a word"},
                                        {"name": "limits", "value": {"max": 3}}]'
  rlm-sandbox repl --lm http://localhost:8000/v1/chat/completions   (key: RLM_SANDBOX_LM_API_KEY)
  rlm-sandbox repl --server /run/rlm-sandbox.sock --lm echo   (a warm session of `serve`)
)text";

// One line per event, whole lines only, from any thread.
class Output {
 public:
  void line(const json& message) {
    const auto text = message.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard lock(mutex_);
    write_all(STDOUT_FILENO, text);
  }

 private:
  std::mutex mutex_;
};

// The orchestrator as the LM: each query becomes an llm_query event; its llm_result line
// completes it.
class OrchestratorHandler final : public LlmHandler {
 public:
  explicit OrchestratorHandler(Output& output) : output_(output) {}

  void set_current_request(json id) {
    std::lock_guard lock(mutex_);
    current_ = std::move(id);
  }

  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    json event;
    {
      std::lock_guard lock(mutex_);
      if (closed_) {
        done(LlmAnswer::of_error("the orchestrator closed its input"));
        return;
      }
      if (call.is_cancelled()) {
        done(LlmAnswer::of_error("the cell that asked has ended"));
        return;
      }
      const auto query_id = next_query_++;
      const bool tool = call.kind == CallKind::tool;
      pending_[query_id] = Pending{std::move(done), tool};
      event = {{"id", current_},
               {"event", "llm_query"},
               {"query_id", query_id},
               {"prompt", prompt_of(call)},
               {"model", call.model ? json(*call.model) : json()},
               {"kind", to_string(call.kind)}};
      if (tool) event["tool"] = std::move(call.tool);
    }
    output_.line(event);
  }

  // A checked llm_result line; returns an error message when no call waits for it, or when its
  // kind of answer does not fit the call (the call still waits then).
  std::string complete(const ReplRequest& line) {
    std::function<void(LlmAnswer)> done;
    LlmAnswer answer;
    {
      std::lock_guard lock(mutex_);
      auto found = pending_.find(line.query_id);
      if (found == pending_.end())
        return "no llm_query is waiting with query_id " + std::to_string(line.query_id);
      const bool tool = found->second.tool;
      if (line.value && !tool)
        return "query " + std::to_string(line.query_id) +
               " is no tool call: answer it with \"text\" or \"error\"";
      if (line.error)
        answer = LlmAnswer::of_error(*line.error);
      else if (tool)  // a tool's answer is JSON text; "text" answers it with that string
        answer = LlmAnswer::of_text((line.value ? *line.value : json(*line.text))
                                        .dump(-1, ' ', false, json::error_handler_t::replace));
      else
        answer = LlmAnswer::of_text(*line.text);
      done = std::move(found->second.done);
      pending_.erase(found);
    }
    done(std::move(answer));
    return "";
  }

  void close() {
    std::map<std::uint64_t, Pending> pending;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      pending.swap(pending_);
    }
    for (auto& [id, call] : pending)
      call.done(LlmAnswer::of_error("the orchestrator closed its input"));
  }

 private:
  struct Pending {
    std::function<void(LlmAnswer)> done;
    bool tool = false;
  };

  // The prompt as the event shows it: a string, or the message list or tool arguments the
  // session checked and wrote as JSON (at most 64 levels deep: parsing and printing it is safe).
  static json prompt_of(LlmCall& call) {
    if (!call.prompt_is_json) return std::move(call.prompt);
    json value = json::parse(call.prompt, nullptr, /*allow_exceptions=*/false);
    return value.is_discarded() ? json(std::move(call.prompt)) : value;
  }

  Output& output_;
  std::mutex mutex_;
  json current_;
  std::uint64_t next_query_ = 1;
  std::map<std::uint64_t, Pending> pending_;
  bool closed_ = false;
};

// Requests other than llm_result, in order; nullopt once stdin has ended. Bounded by count and
// by the bytes of their lines. When full, push() waits for room if `wait` (the reader then stops
// reading stdin: backpressure on the orchestrator's pipe), else refuses the request: the reader
// must not stop while llm_result lines may be waiting behind it.
class RequestQueue {
 public:
  static constexpr std::size_t kMaxRequests = 256;
  static constexpr std::size_t kMaxBytes = 4 * kMaxReplLineBytes;

  bool push(std::optional<ReplRequest> request, std::size_t line_bytes = 0, bool wait = false) {
    {
      std::unique_lock lock(mutex_);
      const auto full = [&] {
        return requests_.size() >= kMaxRequests || bytes_ + line_bytes > kMaxBytes;
      };
      if (request && wait) room_.wait(lock, [&] { return !full(); });
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

 private:
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<std::pair<std::optional<ReplRequest>, std::size_t>> requests_;
  std::size_t bytes_ = 0;
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

// The reader thread: the orchestrator's lines from stdin, each checked; llm_result answered at
// once, every other request queued for the main thread, every bad line answered with one error.
void read_requests(Output& output, RequestQueue& requests, OrchestratorHandler* orchestrator,
                   const ReplInputLimits& limits, bool context_allowed) {
  const auto on_line = [&](std::string_view text, bool overlong) {
    try {
      if (overlong)
        return output.line(error_line(json(), overlong_line_message(limits.max_line_bytes)));
      if (blank_line(text)) return;
      auto parsed = parse_repl_request(text, limits);
      if (auto* error = std::get_if<ReplRequestError>(&parsed))
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
  LineSplitter splitter(limits.max_line_bytes);
  std::string chunk(1 << 16, '\0');
  for (;;) {
    const ssize_t got = read(STDIN_FILENO, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    splitter.feed(std::string_view(chunk.data(), static_cast<std::size_t>(got)), on_line);
  }
  splitter.finish(on_line);
}

}  // namespace

int repl_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()             //
      ("help,h", "show this help")  //
      ("policy,p", po::value<std::string>()->default_value("python-repl"),
       "shipped policy name or a JSON file")  //
      ("backend,b", po::value<std::string>()->default_value("auto"),
       "auto, namespace or local (auto tries the policy's backend.prefer in order)")  //
      ("context", po::value<std::string>(),
       "a host file whose text becomes `context` (any size up to the memory limit)")    //
      ("context-json", po::bool_switch(), "parse the context as JSON instead of text")  //
      ("lm", po::value<std::string>(),
       "who answers llm_query: echo, command:CMD, http:URL; default: the orchestrator, over "
       "llm_query events on stdout")  //
      ("timeout,t", po::value<std::string>(),
       "each cell's default time limit (waiting for llm_query answers does not count)")  //
      ("memory,m", po::value<std::string>(), "the session's memory limit, e.g. 256M")    //
      ("llm-concurrency", po::value<std::string>()->default_value("16"),
       "llm_query, rlm_query and tool calls answered at once (llm_query_batched runs up to "
       "this many)")  //
      ("llm-timeout", po::value<std::string>()->default_value("600s"),
       "a call fails after this long without an answer")  //
      ("llm-budget", po::value<std::string>()->default_value("100000"),
       "calls allowed per session (llm_query, rlm_query, tools); later ones fail at once")  //
      ("no-echo", po::bool_switch(),
       "never print the repr of a cell's trailing expression (the RLM library's REPLs do not)")  //
      ("tools", po::value<std::string>(),
       "host-side tools the cells may call: a JSON array of {\"name\", \"description\", "
       "\"value\"}; a tool without a value is a function the orchestrator answers (events of "
       "kind \"tool\"), one with a value is that value")     //
      ("server", po::value<std::string>(), kServerFlagHelp)  //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp);

  auto values = parse_options(args, options, "repl");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  LimitOverrides overrides;
  if (values.count("timeout"))
    overrides.wall_time = duration_flag("--timeout", values["timeout"].as<std::string>());
  if (values.count("memory"))
    overrides.memory_bytes = size_flag("--memory", values["memory"].as<std::string>());
  LlmLimits limits;
  limits.concurrency = count_flag("--llm-concurrency", values["llm-concurrency"].as<std::string>());
  limits.call_timeout = duration_flag("--llm-timeout", values["llm-timeout"].as<std::string>());
  limits.budget = count_flag("--llm-budget", values["llm-budget"].as<std::string>());

  // Shared with the stdin reader thread, which may outlive this function (it sits in read()
  // until stdin ends); the process exits without unwinding once the session is closed.
  auto output = std::make_shared<Output>();
  auto requests = std::make_shared<RequestQueue>();
  std::shared_ptr<OrchestratorHandler> orchestrator;
  std::shared_ptr<LlmHandler> handler;
  if (values.count("lm")) {
    handler = make_llm_handler(values["lm"].as<std::string>());
  } else {
    orchestrator = std::make_shared<OrchestratorHandler>(*output);
    handler = orchestrator;
  }

  SessionOptions session_options;
  session_options.llm = handler;
  session_options.llm_limits = limits;
  session_options.echo_expression = !values["no-echo"].as<bool>();
  if (values.count("tools")) {
    const auto text = values["tools"].as<std::string>();
    if (auto problem = json_shape_problem(text, ReplInputLimits{}); !problem.empty())
      throw Error("--tools: " + problem);
    const json tools = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded()) throw Error("--tools: not valid JSON");
    try {
      session_options.tools = tools_from_json(tools);
    } catch (const Error& error) {
      throw Error(std::string("--tools: ") + error.what());
    }
  }
  session_options.context_is_json = values["context-json"].as<bool>();
  if (values.count("context")) {
    session_options.context_file = values["context"].as<std::string>();
    std::ifstream probe(session_options.context_file);
    if (!probe) throw Error("--context " + session_options.context_file + ": cannot read it");
  }

  // With a server, its own copy of the policy is the one tightened (and sent only when a flag
  // changed it); a server that cannot serve ends the command here (exit 125).
  const std::string policy_name = values["policy"].as<std::string>();
  std::unique_ptr<ServerConnection> server;
  std::unique_ptr<Backend> backend;
  Policy policy;
  if (auto socket = server_socket(values)) {
    server = std::make_unique<ServerConnection>(*socket, server_uid(values));
    policy = server->policy(policy_name);
  } else {
    policy = load_policy(policy_name);
  }
  tighten(policy, overrides);
  const bool policy_changed = overrides.wall_time || overrides.memory_bytes;
  if (!server) backend = select_backend(policy, values["backend"].as<std::string>());

  ReplInputLimits input_limits;
  input_limits.max_timeout = policy.limits.wall_time;
  const bool context_allowed = session_options.context_file.empty();
  std::thread([output, requests, orchestrator, input_limits, context_allowed] {
    read_requests(*output, *requests, orchestrator.get(), input_limits, context_allowed);
    if (orchestrator) orchestrator->close();
    requests->push(std::nullopt);
  }).detach();

  // Without --context the first line may carry the context, so the session opens once it is
  // read; with --context it opens (and says ready) at once.
  std::optional<ReplRequest> first;
  bool have_first = false;
  if (session_options.context_file.empty()) {
    first = requests->pop();
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

  std::unique_ptr<Session> session;
  try {
    session = server ? server->open_session(policy_name, policy_changed ? &policy : nullptr,
                                            std::move(session_options))
                     : backend->open_session(policy, std::move(session_options));
  } catch (const Error& error) {
    print_error(error.what());
    std::_Exit(kExitSetup);  // as below: the reader thread may be in read()
  }
  output->line({{"event", "ready"}, {"backend", session->backend()}, {"policy", policy.name}});

  auto request = have_first ? std::move(first) : requests->pop();
  for (; request; request = requests->pop())
    if (!serve(*session, orchestrator.get(), *request, *output)) break;
  session->close();
  std::cout.flush();
  // The reader thread may still be blocked on stdin, using the shared state: leave without
  // running static destructors under it. LM commands still running die with their guards.
  std::_Exit(0);
}

}  // namespace rlm::cli
