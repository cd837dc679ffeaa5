// `rlm-sandbox repl`: a persistent sandboxed Python session driven over JSON lines on
// stdin/stdout (docs/sessions.md). The protocol is the library's repl engine
// (rlm_sandbox/repl.hpp); this is its flags, where the session opens, and the exit status.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

#include "cli.hpp"
#include "limit_flags.hpp"
#include "policy_flags.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/repl.hpp"
#include "rlm_sandbox/session.hpp"
#include "server_client.hpp"

namespace po = boost::program_options;

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
            or "history_file": "path" (its JSON: parsed in the sandbox, so each message keeps
            its key order); sets history_N (and history for 0); "index" as for add_context
      {"id": 4, "op": "snapshot"}     {"id": 5, "op": "restore", "snapshot": 1}
      {"id": 8, "op": "save", "path": "run.save"}    {"id": 9, "op": "load", "path": "run.save"}
            save writes the session's variables, contexts, histories, /tmp and cwd to a file
            (mode 0600); load, in any later repl with the same policy, replaces its state with
            the file's (checked first: a changed or cut-short file is refused)
      {"id": 6, "op": "narrow_network", "allow": ["https://pypi.org"]}
            under an egress allowlist: only these entries from now on (each within the list;
            [] for no network); open connections they do not let through end
      {"id": 7, "op": "close"}
      {"op": "context", "context": "..."}   as the first request, when --context is not given
out:  {"event": "ready", "backend": "namespace", "policy": "python-repl"}
            (at once with --context; otherwise after the first request, which may be the context)
      {"id": 1, "event": "llm_query", "query_id": 7, "prompt": "...", "model": null,
       "kind": "llm"}
            (only without --lm: the orchestrator answers it with llm_result). "prompt" is a
            string or a message list [{"role", "content"}...] (with --bulk-dir a long text
            comes as "prompt_file" instead); "kind" is "llm" (llm_query),
            "rlm" (rlm_query) or "tool" (then "tool" names it and "prompt" is
            {"args": [...], "kwargs": {...}})
      {"id": 1, "result": {"status", "stdout", "stderr", "final", "wall_ms", "cpu_ms",
                           "llm_calls", "rolled_back", ...}}
            and when set: "answer" (answer["content"] once answer["ready"] was set), "locals"
            ([{"name", "type", "repr", "value"?}...]), "fetched" ({"value"} or {"error"}),
            "index"
            (add_context, add_history), "saved" ({"bytes", "skipped": [{"name", "type",
            "why"}...]}: save, the variables it could not keep)
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
       "who answers llm_query: echo, command:CMD, or an http(s) URL; default: the orchestrator, "
       "over "
       "llm_query events on stdout")  //
      ("timeout", po::value<std::string>(),
       "each cell's default time limit (waiting for llm_query answers does not count)")  //
      ("memory,m", po::value<std::string>(), "the session's memory limit, e.g. 256M")    //
      ("llm-concurrency", po::value<std::string>()->default_value("16"),
       "llm_query, rlm_query and tool calls answered at once (llm_query_batched runs up to "
       "this many)")  //
      ("llm-timeout", po::value<std::string>()->default_value("600s"),
       "a call fails after this long without an answer")  //
      ("llm-budget", po::value<std::string>()->default_value("100000"),
       "calls allowed per session (llm_query, rlm_query, tools); later ones fail at once")  //
      ("bulk-dir", po::value<std::string>(),
       "a directory of the orchestrator's: a text prompt over 64 KiB is written to a new file "
       "there (mode 0600) and its llm_query event carries \"prompt_file\" and "
       "\"prompt_bytes\" instead of \"prompt\"; read the file, then remove it (the Python "
       "client does this by itself)")  //
      ("no-echo", po::bool_switch(),
       "never print the repr of a cell's trailing expression (the RLM library's REPLs do not)")  //
      ("tools", po::value<std::string>(),
       "host-side tools the cells may call: a JSON array of {\"name\", \"description\", "
       "\"value\", \"encoding\"}; a tool without a value is a function the orchestrator "
       "answers (events of kind \"tool\"), one with a value is that value; \"encoding\": "
       "\"python\" carries tuples, sets, bytes, dict order and exception types in tagged JSON "
       "(docs/control-channel.md)")                          //
      ("server", po::value<std::string>(), kServerFlagHelp)  //
      ("fleet", po::value<std::string>(), kFleetFlagHelp)    //
      ("server-uid", po::value<std::string>(), kServerUidFlagHelp);
  add_tls_flags(options);
  add_mount_and_env_options(options);

  std::vector<po::option> in_order;
  auto values = parse_options(args, options, "repl", nullptr, &in_order);
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  LimitOverrides overrides;
  if (values.count("timeout"))
    overrides.wall_time = duration_flag("--timeout", values["timeout"].as<std::string>());
  if (values.count("memory"))
    overrides.memory_bytes = size_flag("--memory", values["memory"].as<std::string>());
  const std::vector<MountFlag> mounts = mount_flags(in_order);
  std::map<std::string, std::string> env;
  add_env_flags(values, env);
  LlmLimits limits;
  limits.concurrency = count_flag("--llm-concurrency", values["llm-concurrency"].as<std::string>());
  limits.call_timeout = duration_flag("--llm-timeout", values["llm-timeout"].as<std::string>());
  limits.budget = count_flag("--llm-budget", values["llm-budget"].as<std::string>());

  ReplOptions repl;
  SessionOptions& session_options = repl.session;
  if (values.count("lm")) session_options.llm = make_llm_handler(values["lm"].as<std::string>());
  session_options.llm_limits = limits;
  session_options.echo_expression = !values["no-echo"].as<bool>();
  if (values.count("bulk-dir")) repl.bulk_dir = values["bulk-dir"].as<std::string>();
  if (values.count("tools")) {
    try {
      session_options.tools = repl_tools_from_text(values["tools"].as<std::string>());
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
  const auto fleet = fleet_of(values);
  if (fleet) {
    policy = fleet->policy(policy_name);
  } else if (auto socket = server_socket(values)) {
    server = std::make_unique<ServerConnection>(*socket, server_uid(values), tls_files(values));
    policy = server->policy(policy_name);
  } else {
    policy = load_policy(policy_name);
  }
  tighten(policy, overrides);
  for (const auto& [name, value] : env) policy.env.set[name] = value;
  policy = apply_policy_flags(std::move(policy), mounts, values);
  const bool policy_changed =
      overrides.wall_time || overrides.memory_bytes || !mounts.empty() || !env.empty();
  if (!server && !fleet) backend = select_backend(policy, values["backend"].as<std::string>());

  repl.policy_name = policy.name;
  repl.max_timeout = policy.limits.wall_time;
  repl.open_session = [&](SessionOptions options) {
    if (fleet)
      return fleet->open_session(policy_name, policy_changed ? &policy : nullptr,
                                 std::move(options));
    return server ? server->open_session(policy_name, policy_changed ? &policy : nullptr,
                                         std::move(options))
                  : backend->open_session(policy, std::move(options));
  };
  try {
    serve_repl(std::move(repl), STDIN_FILENO, STDOUT_FILENO);
  } catch (const Error& error) {  // the session could not start
    print_error(error.what());
    std::_Exit(kExitSetup);
  }
  std::cout.flush();
  // LM commands still running die with their guards: leave without unwinding under them.
  std::_Exit(0);
}

}  // namespace rlm::cli
