// The session ops: a REPL session from the pool, driven by the client's frames; the cell's
// llm_query calls go to the client as llm_call frames and come back as llm_answer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sys/sys.hpp"
#include "server/connection.hpp"
#include "session/pending_calls.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

constexpr std::chrono::hours kMaxLifetime{24};
constexpr std::chrono::seconds kContextDeadline{60};
constexpr std::size_t kMaxNarrowingEntries = 1024;  // entries in one narrow_network frame

// Answers the cell's calls by asking the client. Every call gets an id; the client's llm_answer
// with that id completes it; calls still open when the connection ends are answered with errors.
class ClientHandler final : public LlmHandler {
 public:
  explicit ClientHandler(std::shared_ptr<SharedSender> link) : link_(std::move(link)) {}

  // answer() writes the call out and returns; its answer comes back later.
  bool hands_calls_on() const override { return true; }

  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    const auto id = calls_.add(call, std::move(done));
    if (!id) return;
    json frame = {{"op", "llm_call"},
                  {"id", *id},
                  {"prompt", std::move(call.prompt)},
                  {"model", call.model ? json(*call.model) : json()},
                  {"kind", to_string(call.kind)}};
    if (call.prompt_is_json) frame["prompt_is_json"] = true;
    if (call.kind == CallKind::tool) frame["tool"] = call.tool;
    const bool sent = link_->send(frame);
    if (!sent) complete(*id, LlmAnswer::of_error("the client is gone"));
  }

  // False when no call waits with this id.
  bool complete(std::uint64_t id, LlmAnswer answer) {
    return calls_.complete(id, std::move(answer));
  }

  void close() { calls_.close(); }

 private:
  std::shared_ptr<SharedSender> link_;
  session::PendingCalls calls_{"the client is gone"};
};

// The context from the client's fd (check_client_fd has passed it), copied into a memfd of the
// server's own; never reopened through the client's fd.
UniqueFd copy_context(int from, std::uint64_t max_bytes) {
  UniqueFd memfd(memfd_create("rlm-sandbox-server-context", MFD_CLOEXEC));
  if (!memfd) throw Refusal("internal", "memfd_create: " + sys::errno_text(errno));
  const auto deadline = Clock::now() + kContextDeadline;
  std::string chunk(1u << 20, '\0');
  std::uint64_t total = 0;
  for (;;) {
    if (!wait_readable(from, deadline))
      throw Refusal("invalid", "the context did not arrive in time");
    const ssize_t got = read(from, chunk.data(), chunk.size());
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0)
      throw Refusal("invalid", "the context fd cannot be read: " + sys::errno_text(errno));
    if (got == 0) break;
    total += static_cast<std::uint64_t>(got);
    if (total > max_bytes)
      throw Refusal("refused", "the context is larger than this server's limit of " +
                                   std::to_string(max_bytes) + " bytes");
    for (ssize_t written = 0; written < got;) {
      const ssize_t n =
          write(memfd.get(), chunk.data() + written, static_cast<std::size_t>(got - written));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Refusal("internal", "writing the context: " + sys::errno_text(errno));
      written += n;
    }
  }
  return memfd;
}

// An optional positive integer of `options` at most `max`, else `fallback`.
std::uint64_t option(const json& options, const char* key, std::uint64_t fallback,
                     std::uint64_t max) {
  const auto found = options.find(key);
  if (found == options.end()) return fallback;
  if (!found->is_number_unsigned() || found->get<std::uint64_t>() == 0 ||
      found->get<std::uint64_t>() > max)
    throw Refusal("invalid", std::string("session option \"") + key +
                                 "\" must be an integer from 1 to " + std::to_string(max));
  return found->get<std::uint64_t>();
}

// An op of the client's, with the fd that came on its frame (add_context's input).
struct Op {
  json frame;
  UniqueFd fd;
};

// One op at a time, done on a thread of its own so that the connection's thread keeps reading
// llm_answer frames while a cell runs.
class Executor {
 public:
  explicit Executor(std::function<bool(Op&)> work)
      : work_(std::move(work)), thread_([this] { loop(); }) {}
  ~Executor() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  // Holds one op while another runs (its answer is sent before the op counts as done, so the
  // client's next request may come first); false when one is held already.
  bool post(Op op) {
    {
      std::lock_guard lock(mutex_);
      if (op_ || done_) return false;
      op_ = std::move(op);
    }
    changed_.notify_all();
    return true;
  }
  bool finished() {
    std::lock_guard lock(mutex_);
    return done_;
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return quit_ || op_; });
      if (!op_) return;
      Op op = std::move(*op_);
      op_.reset();
      lock.unlock();
      const bool more = work_(op);
      lock.lock();
      if (!more) {
        done_ = true;
        return;
      }
    }
  }

  std::function<bool(Op&)> work_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Op> op_;
  bool quit_ = false, done_ = false;
  std::thread thread_;
};

// add_context {kind, format, index} with its input on an fd: copied into a memfd of the server's
// own first (as the session's context), then handed to the session.
CellResult add_context(Session& session, const json& op, UniqueFd fd, std::uint64_t max_bytes) {
  if (!fd) throw Error("add_context needs its input as an fd on the frame");
  check_client_fd(fd.get(), "add_context input", FdUse::data);
  const json kind = op.value("kind", json());
  const json format = op.value("format", json("text"));
  const json index = op.value("index", json());
  if (kind != "context" && kind != "history")
    throw Error("\"kind\" must be \"context\" or \"history\"");
  if (format != "text" && format != "json") throw Error("\"format\" must be \"text\" or \"json\"");
  if (!index.is_null() && !index.is_number_unsigned())
    throw Error("\"index\" must be a non-negative integer or null");
  const UniqueFd copy = copy_context(fd.get(), max_bytes);
  fd.reset();
  ContextInput input;
  input.is_json = format == "json";
  input.file = "/proc/self/fd/" + std::to_string(copy.get());
  std::optional<std::size_t> at;
  if (index.is_number_unsigned()) at = index.get<std::size_t>();
  return session.add_context(kind == "context" ? ContextKind::context : ContextKind::history, input,
                             at);
}

// A save op: the client's file (opened by it for writing, a regular file: the server never
// waits on a pipe a client may not read) gets the save file.
CellResult save_session(Session& session, UniqueFd fd) {
  if (!fd) throw Error("save needs the file to write as an fd on the frame");
  check_client_fd(fd.get(), "save file", FdUse::data);
  struct stat info {};
  const int mode = fcntl(fd.get(), F_GETFL);
  if (fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) || mode < 0 ||
      ((mode & O_ACCMODE) != O_WRONLY && (mode & O_ACCMODE) != O_RDWR))
    throw Error("the save file must be a regular file opened for writing");
  return session.save_to_fd(fd.get());
}

CellResult load_session(Session& session, UniqueFd fd) {
  if (!fd) throw Error("load needs the save file as an fd on the frame");
  check_client_fd(fd.get(), "save file", FdUse::data);
  return session.load_from_fd(fd.get());
}

// A session_open frame's "options", checked (and that at most one fd, the context, came with
// it): the session's options but its context, LM handler and bind owner, and whether the client
// answers the cells' calls ("llm": "client") or nobody does ("none").
struct OpenOptions {
  SessionOptions session;
  bool client_answers = true;
};

OpenOptions open_options(const json& frame, std::size_t fd_count) {
  const json options_json = frame.value("options", json::object());
  if (!options_json.is_object()) throw Refusal("invalid", "\"options\" must be an object");
  for (const auto& [key, value] : options_json.items())
    if (key != "context_is_json" && key != "lifetime_ms" && key != "llm" &&
        key != "llm_concurrency" && key != "llm_timeout_ms" && key != "llm_budget" &&
        key != "echo" && key != "tools")
      throw Refusal("invalid", "unknown session option");
  if (fd_count > 1) throw Refusal("invalid", "session_open takes at most 1 fd (the context)");

  OpenOptions open;
  SessionOptions& options = open.session;
  const auto is_json = options_json.find("context_is_json");
  if (is_json != options_json.end()) {
    if (!is_json->is_boolean()) throw Refusal("invalid", "\"context_is_json\" must be a boolean");
    options.context_is_json = is_json->get<bool>();
  }
  if (const auto echo = options_json.find("echo"); echo != options_json.end()) {
    if (!echo->is_boolean()) throw Refusal("invalid", "\"echo\" must be a boolean");
    options.echo_expression = echo->get<bool>();
  }
  if (const auto tools = options_json.find("tools"); tools != options_json.end()) {
    try {
      options.tools = tools_from_json(*tools);
    } catch (const Error& error) {
      throw Refusal("invalid", error.what());
    }
  }
  options.lifetime = std::chrono::milliseconds(
      option(options_json, "lifetime_ms", std::chrono::milliseconds(kMaxLifetime).count(),
             std::chrono::milliseconds(kMaxLifetime).count()));
  const LlmLimits defaults;
  LlmLimits& limits = options.llm_limits;
  limits.concurrency =
      option(options_json, "llm_concurrency", defaults.concurrency, defaults.concurrency);
  limits.call_timeout = std::chrono::milliseconds(option(options_json, "llm_timeout_ms",
                                                         defaults.call_timeout.count(),
                                                         defaults.call_timeout.count()));
  limits.budget = option(options_json, "llm_budget", defaults.budget, defaults.budget);
  const std::string llm = options_json.value("llm", json("client")).is_string()
                              ? options_json.value("llm", std::string("client"))
                              : std::string("?");
  if (llm != "client" && llm != "none")
    throw Refusal("invalid", "\"llm\" must be \"client\" or \"none\"");
  open.client_answers = llm == "client";
  return open;
}

}  // namespace

void serve_session(const Connection& connection, const json& frame, std::vector<UniqueFd> fds) {
  const Admitted admitted = admit(connection, frame);
  OpenOptions open = open_options(frame, fds.size());
  SessionOptions& options = open.session;
  // Past max_sandboxes, or draining: refused now, never queued. Held until the session ends.
  Node::Slot slot = connection.node.take(connection.peer.uid);

  const auto end_of_life = Clock::now() + options.lifetime;
  options.bind_owner = HostIds{connection.peer.uid, connection.peer.gid};  // request.hpp
  UniqueFd context;
  if (!fds.empty()) {
    check_client_fd(fds.front().get(), "context", FdUse::data);
    context = copy_context(fds.front().get(), connection.config.max_context_bytes);
    fds.clear();
    options.context_file = "/proc/self/fd/" + std::to_string(context.get());
  }

  auto link = std::make_shared<SharedSender>(connection.socket, connection.config.frame_timeout);
  auto client = std::make_shared<ClientHandler>(link);
  if (open.client_answers) options.llm = client;  // the session wraps it with the limits

  // A tightened policy has no warm sessions: it starts cold, on the pool's backend as a run does
  // (the candidate's backend preference is the client's, and may name one that isolates less).
  std::unique_ptr<Session> session;
  try {
    session = admitted.candidate
                  ? admitted.offer->pool->open_session(*admitted.candidate, std::move(options))
                  : admitted.offer->pool->open_session(std::move(options));
  } catch (const Error& error) {
    client->close();
    throw Refusal("unavailable", std::string("the session could not start: ") + error.what());
  }
  context.reset();
  slot.started();
  const std::string& offered = admitted.offer->offered.name;
  // A kill ends the sandbox now: a cell in progress and every later call fail saying so.
  // Declared after the session, so it is gone from the registry before the session is.
  const auto activity = connection.activities.add(
      "session", connection.peer, offered,
      [session = session.get()](const std::string& why) { session->kill(why); });
  json request_event{{"event", "request"},
                     {"op", "session"},
                     {"id", activity->id()},
                     {"policy", offered},
                     {"tightened", admitted.candidate != nullptr}};
  request_event.update(connection.who());
  connection.log.record(std::move(request_event));
  // Opened while the drain's grace ran out: what the drain ended, this would outlive.
  if (connection.node.drained())
    session->kill("node_drained: node " + connection.node.id() + " drained and its grace ran out");
  std::atomic<std::uint64_t> cells{0};
  std::atomic<bool> closed{false}, lifetime_over{false};  // the executor's, the loop's
  // The end's line, once whatever the executor ran is over (declared before it: destroyed after).
  struct AtEnd {
    std::function<void()> log;
    ~AtEnd() { log(); }
  } const log_end{[&] {
    const auto killed = activity->killed();
    const std::string end_reason = killed          ? *killed
                                   : closed        ? "closed"
                                   : lifetime_over ? "its lifetime ran out"
                                                   : "the client left";
    json end{{"event", "end"},    {"op", "session"},       {"id", activity->id()},
             {"policy", offered}, {"cells", cells.load()}, {"reason", end_reason}};
    end.update(connection.who());
    connection.log.record(std::move(end));
  }};
  // The session's id names its node, so a fleet's client finds it without shared state.
  if (!link->send({{"op", "session_opened"},
                   {"backend", session->backend()},
                   {"node", connection.node.id()},
                   {"session_id", connection.node.id() + "/" + std::to_string(activity->id())}})) {
    client->close();
    session->close();
    return;
  }

  // Declared after the session: destroyed first, it waits for the op in progress.
  Executor executor([&](Op& posted) {
    const json& op = posted.frame;
    const std::string name = op.value("op", "");
    try {
      if (name == "execute") {
        const auto code = op.find("code");
        if (code == op.end() || !code->is_string())
          throw Error("execute needs \"code\" (a string)");
        std::optional<std::chrono::milliseconds> timeout;
        if (op.contains("timeout_ms")) {
          const json& value = op["timeout_ms"];
          if (!value.is_number_unsigned() || value.get<std::uint64_t>() == 0 ||
              value.get<std::uint64_t>() > (1u << 31))
            throw Error("\"timeout_ms\" must be a positive integer");
          timeout = std::chrono::milliseconds(value.get<std::uint64_t>());
        }
        ExecuteOptions execute;
        execute.timeout = timeout;
        if (const auto locals = op.find("locals"); locals != op.end()) {
          if (!locals->is_boolean()) throw Error("\"locals\" must be a boolean");
          execute.locals = locals->get<bool>();
        }
        if (const auto fetch = op.find("fetch"); fetch != op.end()) {
          if (!fetch->is_string()) throw Error("\"fetch\" must be a string");
          execute.fetch = fetch->get<std::string>();
        }
        const CellResult cell = session->execute(code->get<std::string>(), execute);
        ++cells;
        link->send({{"op", "cell_result"}, {"result", cell.to_json()}});
      } else if (name == "add_context") {
        const CellResult cell =
            add_context(*session, op, std::move(posted.fd), connection.config.max_context_bytes);
        link->send({{"op", "cell_result"}, {"result", cell.to_json()}});
      } else if (name == "save" || name == "load") {
        const CellResult cell = name == "save" ? save_session(*session, std::move(posted.fd))
                                               : load_session(*session, std::move(posted.fd));
        link->send({{"op", "cell_result"}, {"result", cell.to_json()}});
      } else if (name == "snapshot") {
        link->send({{"op", "snapshot"}, {"id", session->snapshot()}});
      } else if (name == "restore") {
        const auto id = op.find("id");
        if (id == op.end() || !id->is_number_unsigned()) throw Error("restore needs \"id\"");
        session->restore(id->get<SnapshotId>());
        link->send({{"op", "restored"}});
      } else if (name == "narrow_network") {
        const auto allow = op.find("allow");
        if (allow == op.end() || !allow->is_array() || allow->size() > kMaxNarrowingEntries)
          throw Error("narrow_network needs \"allow\": an array of at most " +
                      std::to_string(kMaxNarrowingEntries) + " allow entries");
        std::vector<std::string> entries;
        for (const auto& entry : *allow) {
          if (!entry.is_string()) throw Error("narrow_network: each allow entry is a string");
          entries.push_back(entry.get<std::string>());
        }
        // Checked against the session's own list (the client's, already within the server's).
        session->narrow_network(entries);
        json narrowed{{"event", "narrow_network"},
                      {"op", "session"},
                      {"id", activity->id()},
                      {"allow", entries}};
        narrowed.update(connection.who());
        connection.log.record(std::move(narrowed));
        link->send({{"op", "narrowed"}});
      } else if (name == "close") {
        client->close();
        Result result = session->close();
        if (const auto killed = activity->killed()) {
          result.status = connection.node.drained() ? Status::node_drained : Status::interrupted;
          result.detail = *killed;
        }
        result.node = connection.node.id();
        closed = true;
        slot.release();
        link->send({{"op", "closed"}, {"result", result.to_json()}});
        return false;
      }
    } catch (const std::exception& error) {
      // A session the drain ended says so in its kind, for a client to place its work anew.
      const bool drained = connection.node.drained() && activity->killed();
      link->send(error_frame(drained ? "node_drained" : "invalid", error.what()));
    }
    return true;
  });

  // The connection's thread: frames in, until close is done, the client leaves or breaks the
  // protocol. An idle client is bounded by the session's lifetime.
  for (;;) {
    if (executor.finished()) break;
    if (Clock::now() >= end_of_life) {
      lifetime_over = true;
      break;
    }
    std::optional<Frame> next;
    try {
      // Short waits, so a close done by the executor is noticed.
      if (!wait_readable(connection.socket, Clock::now() + std::chrono::milliseconds(200)))
        continue;
      next = connection.receive(Clock::now() + connection.config.frame_timeout);
    } catch (const FrameRefused& refused) {
      link->send(error_frame("unavailable", refused.what()));
      break;
    } catch (const Error&) {
      break;
    }
    if (!next) break;
    const json& message = next->message;
    const std::string op = message["op"].get<std::string>();
    if (op == "llm_answer") {
      const auto id = message.find("id");
      const auto text = message.find("text");
      const auto error = message.find("error");
      if (id == message.end() || !id->is_number_unsigned()) continue;
      LlmAnswer answer = text != message.end() && text->is_string()
                             ? LlmAnswer::of_text(text->get<std::string>())
                             : LlmAnswer::of_error(error != message.end() && error->is_string()
                                                       ? error->get<std::string>()
                                                       : "the client gave no answer");
      client->complete(id->get<std::uint64_t>(), std::move(answer));
    } else if (op == "execute" || op == "snapshot" || op == "restore" || op == "close" ||
               op == "add_context" || op == "narrow_network" || op == "save" || op == "load") {
      UniqueFd fd;
      if ((op == "add_context" || op == "save" || op == "load") && next->fds.size() == 1)
        fd = std::move(next->fds.front());
      if (!executor.post({message, std::move(fd)}))
        link->send(
            error_frame("invalid", "one request at a time: wait for the answer to the last"));
    } else {
      link->send(error_frame("invalid", "unknown op in a session"));
    }
  }
  // The client left (or closed): open calls fail at once, so a running cell ends soon; the op in
  // progress is waited for (bounded by the cell's own limits), then the session closes.
  client->close();
  link->detach();
}

}  // namespace rlm::server
