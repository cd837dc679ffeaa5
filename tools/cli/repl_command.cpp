// `rlm-sandbox repl`: a persistent sandboxed Python session driven over JSON lines on
// stdin/stdout (DESIGN.md §8, docs/sessions.md). A reader thread takes the orchestrator's lines,
// so `llm_result` answers arrive while a cell runs; everything else is done in order on the main
// thread.
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
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

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
      {"op": "llm_result", "query_id": 7, "text": "..."}       (or "error": "...")
      {"id": 2, "op": "snapshot"}     {"id": 3, "op": "restore", "snapshot": 1}
      {"id": 4, "op": "close"}
      {"op": "context", "context": "..."}   as the first line, when --context is not given
out:  {"event": "ready", "backend": "namespace", "policy": "python-repl"}
            (at once with --context; otherwise after the first line, which may be the context)
      {"id": 1, "event": "llm_query", "query_id": 7, "prompt": "...", "model": null}
            (only without --lm: the orchestrator answers it with llm_result)
      {"id": 1, "result": {"status", "stdout", "stderr", "final", "wall_ms", "cpu_ms",
                           "llm_calls", "rolled_back", ...}}
      {"id": 9, "error": "..."}       for a request that could not be done

Inside the sandbox: context, llm_query(prompt, model=None), llm_query_batched(prompts,
model=None), FINAL(value), FINAL_VAR(name), SHOW_VARS().

exit status: 0 after close or the end of stdin; 125 the session could not start; 2 bad usage.
)text";

constexpr const char* kExamples = R"text(
examples:
  echo '{"id":1,"op":"execute","code":"print(len(context))"}' |
      rlm-sandbox repl --context prompt.txt --lm echo
  rlm-sandbox repl --policy python-repl --lm 'command:./ask-model.sh' --timeout 30s
  rlm-sandbox repl --lm http://localhost:8000/v1/chat/completions   (key: RLM_SANDBOX_LM_API_KEY)
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
      pending_[query_id] = std::move(done);
      event = {{"id", current_},
               {"event", "llm_query"},
               {"query_id", query_id},
               {"prompt", std::move(call.prompt)},
               {"model", call.model ? json(*call.model) : json()}};
    }
    output_.line(event);
  }

  // An llm_result line; returns an error message for a bad one.
  std::string complete(const json& line) {
    const auto id = line.value("query_id", json());
    if (!id.is_number_unsigned()) return "llm_result needs a numeric query_id";
    std::function<void(LlmAnswer)> done;
    {
      std::lock_guard lock(mutex_);
      auto found = pending_.find(id.get<std::uint64_t>());
      if (found == pending_.end()) return "no llm_query is waiting with query_id " + id.dump();
      done = std::move(found->second);
      pending_.erase(found);
    }
    if (line.contains("text") && line["text"].is_string())
      done(LlmAnswer::of_text(line["text"].get<std::string>()));
    else if (line.contains("error") && line["error"].is_string())
      done(LlmAnswer::of_error(line["error"].get<std::string>()));
    else
      done(LlmAnswer::of_error("the orchestrator's llm_result had neither text nor error"));
    return "";
  }

  void close() {
    std::map<std::uint64_t, std::function<void(LlmAnswer)>> pending;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      pending.swap(pending_);
    }
    for (auto& [id, done] : pending) done(LlmAnswer::of_error("the orchestrator closed its input"));
  }

 private:
  Output& output_;
  std::mutex mutex_;
  json current_;
  std::uint64_t next_query_ = 1;
  std::map<std::uint64_t, std::function<void(LlmAnswer)>> pending_;
  bool closed_ = false;
};

// Requests other than llm_result, in order; nullopt once stdin has ended.
class RequestQueue {
 public:
  void push(std::optional<json> request) {
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(std::move(request));
    }
    ready_.notify_one();
  }
  std::optional<json> pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !requests_.empty(); });
    auto request = std::move(requests_.front());
    requests_.pop_front();
    return request;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::optional<json>> requests_;
};

json error_line(const json& id, const std::string& message) {
  return {{"id", id}, {"error", message}};
}

std::optional<std::chrono::milliseconds> cell_timeout(const json& request) {
  if (!request.contains("timeout_ms")) return std::nullopt;
  const auto& value = request["timeout_ms"];
  if (!value.is_number() || value.get<double>() <= 0)
    throw Error("timeout_ms must be a positive number of milliseconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(value.get<double>()));
}

// Does one request; returns false after close.
bool serve(Session& session, OrchestratorHandler* orchestrator, const json& request,
           Output& output) {
  const json id = request.value("id", json());
  const std::string op = request.value("op", "");
  try {
    if (op == "execute") {
      if (!request.contains("code") || !request["code"].is_string())
        throw Error("execute needs \"code\": a string");
      if (orchestrator) orchestrator->set_current_request(id);
      const auto cell = session.execute(request["code"].get<std::string>(), cell_timeout(request));
      output.line({{"id", id}, {"result", cell.to_json()}});
    } else if (op == "snapshot") {
      output.line({{"id", id}, {"result", {{"snapshot", session.snapshot()}}}});
    } else if (op == "restore") {
      const auto snapshot = request.value("snapshot", json());
      if (!snapshot.is_number_unsigned())
        throw Error("restore needs \"snapshot\": an id from a snapshot result");
      session.restore(snapshot.get<SnapshotId>());
      output.line({{"id", id}, {"result", {{"restored", snapshot}}}});
    } else if (op == "close") {
      output.line({{"id", id}, {"result", session.close().to_json()}});
      return false;
    } else if (op == "context") {
      throw Error("the context can only be given as the first line, and not with --context");
    } else {
      throw Error(op.empty() ? "a request needs an \"op\""
                             : "unknown op '" + op +
                                   "'; expected execute, llm_result, snapshot, restore or close");
    }
  } catch (const Error& error) {
    output.line(error_line(id, error.what()));
  }
  return true;
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
      ("llm-concurrency", po::value<std::string>()->default_value("8"),
       "llm_query calls answered at once (llm_query_batched runs up to this many)")  //
      ("llm-timeout", po::value<std::string>()->default_value("120s"),
       "an llm_query call fails after this long without an answer")  //
      ("llm-budget", po::value<std::string>()->default_value("1000"),
       "llm_query calls allowed per session; later ones fail at once");

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

  // Shared with the stdin reader thread, which may outlive this function (it sits in getline
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
  session_options.llm = limit_llm_handler(handler, limits);
  session_options.context_is_json = values["context-json"].as<bool>();
  if (values.count("context")) {
    session_options.context_file = values["context"].as<std::string>();
    std::ifstream probe(session_options.context_file);
    if (!probe) throw Error("--context " + session_options.context_file + ": cannot read it");
  }

  Policy policy = load_policy(values["policy"].as<std::string>());
  tighten(policy, overrides);
  auto backend = select_backend(policy, values["backend"].as<std::string>());

  std::thread([output, requests, orchestrator] {
    std::string text;
    while (std::getline(std::cin, text)) {
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      json line = json::parse(text, nullptr, false);
      if (line.is_discarded() || !line.is_object()) {
        output->line(error_line(json(), "not a JSON object: " + text.substr(0, 200)));
        continue;
      }
      if (line.value("op", "") == "llm_result") {
        if (!orchestrator) {
          output->line(error_line(line.value("id", json()),
                                  "llm_result without a pending llm_query (--lm is set)"));
        } else if (auto problem = orchestrator->complete(line); !problem.empty()) {
          output->line(error_line(line.value("id", json()), problem));
        }
        continue;
      }
      requests->push(std::move(line));
    }
    if (orchestrator) orchestrator->close();
    requests->push(std::nullopt);
  }).detach();

  // Without --context the first line may carry the context, so the session opens once it is
  // read; with --context it opens (and says ready) at once.
  std::optional<json> first;
  bool have_first = false;
  if (session_options.context_file.empty()) {
    first = requests->pop();
    have_first = true;
    if (first && first->value("op", "") == "context") {
      const json context = first->value("context", json());
      if (context.is_string() && !session_options.context_is_json) {
        session_options.context = context.get<std::string>();
      } else {
        session_options.context = context.dump();
        session_options.context_is_json = true;
      }
      have_first = false;
    }
  }

  std::unique_ptr<Session> session;
  try {
    session = backend->open_session(policy, std::move(session_options));
  } catch (const Error& error) {
    print_error(error.what());
    std::_Exit(kExitSetup);  // as below: the reader thread holds std::cin
  }
  output->line({{"event", "ready"}, {"backend", session->backend()}, {"policy", policy.name}});

  auto request = have_first ? std::move(first) : requests->pop();
  for (; request; request = requests->pop())
    if (!serve(*session, orchestrator.get(), *request, *output)) break;
  session->close();
  std::cout.flush();
  // The reader thread may still be blocked on stdin and holds std::cin: leave without running
  // static destructors under it.
  std::_Exit(0);
}

}  // namespace rlm::cli
