#include "session/cell.hpp"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>

#include <algorithm>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"
#include "rlm_sys/sys.hpp"
#include "session/frame_fields.hpp"

namespace rlm::session {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// While the wall clock is paused for LM answers, how often the sandbox's CPU time is read.
constexpr milliseconds kCpuCheck{50};
// A batch with more prompts ends the session (the worker refuses to send one).
constexpr std::size_t kMaxBatch = 10'000;

std::string describe_exit(const json& rolled_back) {
  const auto small = [](const json& value) {
    return value.is_number_integer() && value.get<std::int64_t>() >= 0 &&
           value.get<std::int64_t>() <= 255;
  };
  if (const auto& signal = field(rolled_back, "signal"); small(signal)) {
    const char* name = sigabbrev_np(signal.get<int>());
    return "the interpreter died of signal " + std::to_string(signal.get<int>()) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  if (const auto& code = field(rolled_back, "exit_code"); small(code))
    return "the interpreter exited with code " + std::to_string(code.get<int>());
  return "the interpreter ended";
}

// The most messages in one prompt's message list (the frame's value bound holds it anyway).
constexpr std::size_t kMaxMessages = 10'000;

const char* query_name(bool batched) {
  return batched ? "llm_query_batched" : "llm_query";
}

// One prompt: a string, or a message list [{"role": str, "content": str}...] (other keys are
// dropped), passed on as its JSON text. Throws Error for anything else.
broker::Prompt read_prompt(json& raw, bool batched) {
  if (raw.is_string()) return {std::move(raw.get_ref<std::string&>()), false};
  if (!raw.is_array())
    throw Error(std::string(query_name(batched)) + " with a prompt that is no string or list");
  if (raw.size() > kMaxMessages)
    throw Error(std::string(query_name(batched)) + " with a message list of " +
                std::to_string(raw.size()) + " messages, over the limit of " +
                std::to_string(kMaxMessages));
  json messages = json::array();
  for (auto& message : raw) {
    const auto& role = field(message, "role");
    const auto& content = field(message, "content");
    if (!role.is_string() || !content.is_string())
      throw Error(std::string(query_name(batched)) +
                  " with a message that is not {\"role\": str, \"content\": str}");
    messages.push_back(
        {{"role", std::move(message["role"])}, {"content", std::move(message["content"])}});
  }
  return {messages.dump(), true};
}

// A tool call's arguments: {"args": [...], "kwargs": {...}}, passed on as its JSON text.
broker::Prompt read_tool_arguments(json& raw) {
  if (!raw.is_object() || !field(raw, "args").is_array() || !field(raw, "kwargs").is_object())
    throw Error("a tool call whose prompt is not {\"args\": [...], \"kwargs\": {...}}");
  json arguments = {{"args", std::move(raw["args"])}, {"kwargs", std::move(raw["kwargs"])}};
  return {arguments.dump(), true};
}

CallKind read_kind(const json& frame, bool batched) {
  const json& kind = field(frame, "kind");
  if (kind.is_null()) return CallKind::llm;
  if (!kind.is_string())
    throw Error(std::string(query_name(batched)) + " whose kind is not a string");
  const auto& name = kind.get_ref<const std::string&>();
  if (name == "llm") return CallKind::llm;
  if (name == "rlm") return CallKind::rlm;
  if (name == "tool" && !batched) return CallKind::tool;
  throw Error(std::string(query_name(batched)) + " of an unknown kind");
}

// Why the session refuses a call of tool `name` (a name it has no callable tool of), or nullopt.
std::optional<std::string> tool_refusal(const std::string& name,
                                        const std::vector<ToolSpec>& tools) {
  const std::string shown = name.size() > 64 ? name.substr(0, 64) + "..." : name;
  for (const auto& tool : tools)
    if (tool.name == name)
      return tool.value
                 ? std::optional<std::string>("tool '" + shown + "' is a value, not a function")
                 : std::nullopt;
  return "this session has no tool named '" + shown + "'";
}

// An llm_query or llm_query_batched frame as the broker takes it; its prompts are moved out of
// the frame. Throws Error for a malformed one: the session ends. A call of a tool the session
// does not have is answered with an error (Query::refusal).
broker::Query read_query(json& frame, bool batched, const std::vector<ToolSpec>& tools) {
  broker::Query query;
  query.batched = batched;
  query.id = field(frame, "id");
  if (!query.id.is_number_integer())
    throw Error(std::string(query_name(batched)) + " without an integer id");
  query.kind = read_kind(frame, batched);
  const json& model = field(frame, "model");
  if (model.is_string()) query.model = model.get<std::string>();
  json& raw = frame[batched ? "prompts" : "prompt"];
  if (query.kind == CallKind::tool) {
    const json& tool = field(frame, "tool");
    if (!tool.is_string()) throw Error("a tool call without a tool name");
    query.tool = tool.get<std::string>();
    query.model.reset();
    query.prompts.push_back(read_tool_arguments(raw));
    query.refusal = tool_refusal(query.tool, tools);
  } else if (batched) {
    if (!raw.is_array()) throw Error("malformed llm_query_batched frame");
    if (raw.size() > kMaxBatch)
      throw Error("llm_query_batched with " + std::to_string(raw.size()) +
                  " prompts, over the limit of " + std::to_string(kMaxBatch));
    query.prompts.reserve(raw.size());
    for (auto& prompt : raw) query.prompts.push_back(read_prompt(prompt, true));
  } else {
    query.prompts.push_back(read_prompt(raw, false));
  }
  return query;
}

std::string take_text(json& frame, const char* key) {
  const auto found = frame.find(key);
  if (found == frame.end() || !found->is_string()) return {};
  return std::move(found->get_ref<std::string&>());
}

// The most variables a cell_result's `locals` may list (the worker lists at most this many).
constexpr std::size_t kMaxLocals = 1'000;
// The most variables a save's result lists as not saved (the worker lists at most this many).
constexpr std::size_t kMaxSkipped = 1'000;

// The optional fields of a cell_result (answer, locals, fetched, index), each taken only in its
// protocol shape: anything else reads as absent.
void read_extras(json& frame, CellResult& result) {
  if (const auto& content = field(field(frame, "answer"), "content"); content.is_string())
    result.answer = content.get<std::string>();
  if (auto locals = frame.find("locals"); locals != frame.end() && locals->is_array()) {
    json kept = json::array();
    for (auto& item : *locals) {
      if (kept.size() == kMaxLocals) break;
      const auto& name = field(item, "name");
      const auto& type = field(item, "type");
      const auto& repr = field(item, "repr");
      if (!name.is_string() || !type.is_string() || !repr.is_string()) continue;
      json entry = {{"name", std::move(item["name"])},
                    {"type", std::move(item["type"])},
                    {"repr", std::move(item["repr"])}};
      // A small JSON value the worker copied (bounded there, and by the frame here).
      if (auto value = item.find("value"); value != item.end()) entry["value"] = std::move(*value);
      kept.push_back(std::move(entry));
    }
    result.locals = std::move(kept);
  }
  if (auto fetched = frame.find("fetched"); fetched != frame.end() && fetched->is_object()) {
    if (const auto value = fetched->find("value"); value != fetched->end())
      result.fetched = json{{"value", std::move(*value)}};
    else if (const auto& error = field(*fetched, "error"); error.is_string())
      result.fetched = json{{"error", error}};
  }
  if (const auto& index = field(frame, "index"); index.is_number_unsigned())
    result.index = index.get<std::size_t>();
  if (const auto& saved = field(frame, "saved"); saved.is_object()) {
    json skipped = json::array();
    if (const auto& listed = field(saved, "skipped"); listed.is_array())
      for (const auto& item : listed) {
        if (skipped.size() == kMaxSkipped) break;
        const auto& name = field(item, "name");
        const auto& type = field(item, "type");
        const auto& why = field(item, "why");
        if (name.is_string() && type.is_string() && why.is_string())
          skipped.push_back({{"name", name}, {"type", type}, {"why", why}});
      }
    result.saved = json{{"skipped", std::move(skipped)}};
    if (const auto& used = field(saved, "used"); used.is_number_unsigned())
      (*result.saved)["used"] = used;
  }
}

}  // namespace

Cell::Cell(WorkerSession& session, json op, milliseconds limit, int fd)
    : s_(session),
      op_(std::move(op)),
      fd_(fd),
      limit_(limit),
      id_(session.next_id_++),
      budget_(session.policy_.limits.session_buffer_bytes),
      calls_(session.answers_, session.options_.llm) {}

CellResult Cell::run() {
  start_ = Clock::now();
  const auto counters = s_.counters();
  oom_before_ = counters.oom_kills;
  cpu_start_ = counters.cpu;
  network_before_ = counters.network;
  s_.await_standby();
  op_["id"] = id_;
  if (fd_ < 0)
    s_.send_or_end(s_.standby_, op_);
  else if (!s_.standby_.send(op_, fd_))
    s_.fail("the sandboxed interpreter is gone");
  try {
    while (!finished_) step();
  } catch (const Error& error) {
    // The sandbox broke the protocol (garbage, an oversize frame, a wrong reply): the session
    // cannot be trusted any more. The cell says why; later calls throw.
    s_.ended_ = s_.end_reason(error.what());
    s_.abandon();
    result_.status = CellStatus::session_error;
    result_.error = "the session ended: " + s_.ended_;
  }
  calls_.cancel();  // calls this cell made that are still queued in a handler are dropped
  result_.wall = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_);
  if (network_before_)
    if (const auto network = s_.counters().network)
      result_.network = network_since(*network_before_, *network);
  return std::move(result_);
}

// The cell's clock. Its limit runs in wall time, except while the host waits for LM answers (a
// call open, the sandbox not held back by a full buffer, and a CPU counter to watch): the time the
// poll loop then spends idle is not counted, and instead the sandbox's CPU time since the cell
// started is held to the limit, read every kCpuCheck. The host's own work (reading, answering)
// always counts. Without a CPU counter the wall clock never pauses.
bool Cell::should_pause() const {
  return calls_.open() > 0 && cpu_start_ && !held_back_ && s_.standby_ && !rollback_sent_;
}

// When step() must act: the cell's limit, the next CPU check while paused, or (after a rollback
// was asked for) the bound on the checkpoint's answer.
Cell::Clock::time_point Cell::deadline() const {
  if (rollback_sent_) return *rollback_sent_ + WorkerSession::kAnswerBound;
  if (pausing_) return next_cpu_check_;
  return start_ + limit_ + waited_;
}

bool Cell::cpu_exhausted() {
  const auto cpu = s_.counters().cpu;
  if (!cpu) {
    cpu_start_.reset();  // the counter is gone: the wall clock runs from now on
    return false;
  }
  return *cpu - *cpu_start_ >= limit_;
}

// Bytes the session holds for this sandbox: what came from it and is not handled yet, prompts at
// the LM handler (an earlier cell's included), answers not yet sent, and replies not yet written.
std::uint64_t Cell::in_flight() const {
  std::uint64_t total = calls_.in_flight() + s_.checkpoint_->unread() + s_.checkpoint_->unsent();
  if (s_.standby_) total += s_.standby_.unread() + s_.standby_.unsent();
  return total;
}

// How much may be read from the standby now: what is left of the budget; a frame larger than that
// still completes when it alone fills the buffer (the frame cap bounds it).
std::size_t Cell::read_room() const {
  if (!s_.standby_) return 0;
  const std::uint64_t used = in_flight();
  if (used < budget_)
    return static_cast<std::size_t>(std::min<std::uint64_t>(budget_ - used, Channel::kReadSlice));
  if (used == s_.standby_.partial_bytes())
    return std::min(s_.standby_.partial_wants(), Channel::kReadSlice);
  return 0;
}

// The sandbox is held back when the buffer is full and it has more to send.
bool Cell::sandbox_has_more() const {
  if (s_.standby_.partial_wants() > 0) return true;
  int queued = 0;
  return ioctl(s_.standby_.fd(), FIONREAD, &queued) == 0 && queued > 0;
}

void Cell::time_out(Clock::time_point now) {
  rollback_sent_ = now;
  timed_out_ = true;
  if (!s_.checkpoint_->send({{"op", "rollback"}, {"id", id_}, {"reason", "timeout"}}))
    throw Error("the checkpoint interpreter is gone");
}

void Cell::step() {
  auto now = Clock::now();
  const std::size_t room = read_room();
  held_back_ = room == 0 && s_.standby_ && sandbox_has_more();
  const bool pause = should_pause();
  if (pause && !pausing_) next_cpu_check_ = now + kCpuCheck;
  pausing_ = pause;
  if (now >= deadline()) {
    if (rollback_sent_) throw Error("the checkpoint interpreter did not answer the rollback");
    if (!pausing_ || cpu_exhausted()) {
      pausing_ = false;
      time_out(now);
      return;
    }
    next_cpu_check_ = now + kCpuCheck;
    pausing_ = should_pause();  // the CPU counter may have gone
  }
  const int timeout = std::min(sys::poll_timeout_ms(deadline()), 60'000);
  const short standby_events =
      s_.standby_
          ? static_cast<short>((room > 0 ? POLLIN : 0) | (s_.standby_.unsent() ? POLLOUT : 0))
          : 0;
  const short checkpoint_events =
      static_cast<short>(POLLIN | (s_.checkpoint_->unsent() ? POLLOUT : 0));
  pollfd fds[4] = {{s_.checkpoint_->fd(), checkpoint_events, 0},
                   {standby_events ? s_.standby_.fd() : -1, standby_events, 0},
                   {s_.answers_->event_fd(), POLLIN, 0},
                   {s_.run_->done.get(), POLLIN, 0}};
  const int ready = poll(fds, 4, timeout);
  if (pausing_) waited_ += Clock::now() - now;  // idle, waiting for the LM
  if (ready < 0) return;                        // EINTR
  if (fds[2].revents) answer();
  if (fds[1].revents && s_.standby_) serve_standby(fds[1].revents, room);
  if (fds[0].revents) serve_checkpoint(fds[0].revents);
  if (!finished_ && fds[3].revents) throw Error("the sandbox ended" + s_.run_end_detail());
}

void Cell::serve_checkpoint(short revents) {
  Channel& checkpoint = *s_.checkpoint_;
  bool open = true;
  if (revents & (POLLOUT | POLLHUP | POLLERR)) open = checkpoint.flush();
  if (revents & ~POLLOUT) open = checkpoint.receive() && open;
  while (!finished_) {
    auto frame = checkpoint.next_frame();
    if (!frame) break;
    const auto type = text_field(*frame, "type");
    if (type == "rolled_back" && rollback_sent_ && field(*frame, "id").is_null()) {
      // The standby died as our rollback crossed: the checkpoint reported that and forked a
      // new standby, which our rollback then kills. Its fork frame is superseded.
      superseded_fork_ = true;
    } else if (type == "rolled_back") {
      rolled_back(*frame);
    } else if (type == "fork" && superseded_fork_) {
      checkpoint.take_fd();  // closed unused
      superseded_fork_ = false;
    } else {
      throw Error("unexpected frame from the checkpoint interpreter: " + describe_frame(*frame));
    }
  }
  if (!open && !finished_) throw Error("the checkpoint interpreter is gone");
}

void Cell::serve_standby(short revents, std::size_t room) {
  Channel& standby = s_.standby_;
  bool open = true;
  if (revents & (POLLOUT | POLLHUP | POLLERR)) open = standby.flush();
  if (open && room > 0 && (revents & ~POLLOUT)) open = standby.receive(room);
  while (!finished_ && standby) {
    auto frame = standby.next_frame();
    if (!frame) break;
    const auto type = text_field(*frame, "type");
    if (type == "llm_query") {
      ask(*frame, false);
    } else if (type == "llm_query_batched") {
      ask(*frame, true);
    } else if (type == "cell_result") {
      succeeded(*frame);
    } else {
      throw Error("unexpected frame from the sandboxed interpreter: " + describe_frame(*frame));
    }
  }
  if (!open && standby && !finished_) {
    // It died (the checkpoint says how), or it closed its channel (then the cell's deadline
    // ends it): no answer can reach it any more.
    standby.close();
  }
}

void Cell::ask(json& frame, bool batched) {
  auto query = read_query(frame, batched, s_.options_.tools);
  result_.llm_calls += static_cast<unsigned>(query.prompts.size());
  if (auto reply = calls_.ask(std::move(query)); reply && s_.standby_) s_.standby_.send(*reply);
}

// Sends the replies of the calls the handler's answers complete. A failed send shows up as the
// standby's EOF.
void Cell::answer() {
  for (const auto& reply : calls_.collect())
    if (s_.standby_) s_.standby_.send(reply);
}

void Cell::succeeded(json& frame) {
  if (field(frame, "id") != json(id_))
    throw Error("a cell_result for another cell: " + describe_frame(frame));
  if (rollback_sent_) return;  // too late: the checkpoint is already rolling it back
  finished_ = true;
  result_.status = text_field(frame, "status") == "ok" ? CellStatus::ok : CellStatus::error;
  result_.stdout_data = take_text(frame, "stdout");
  result_.stderr_data = take_text(frame, "stderr");
  result_.stdout_truncated = flag_field(frame, "stdout_truncated");
  result_.stderr_truncated = flag_field(frame, "stderr_truncated");
  result_.error = take_text(frame, "error");
  if (auto final = frame.find("final");
      final != frame.end() && final->is_object() && final->contains("value"))
    result_.final = std::move((*final)["value"]);
  read_extras(frame, result_);
  // At most the cell's own wall time could be meant; a day bounds the conversion.
  constexpr double kDayMs = 86'400'000;
  result_.cpu = std::chrono::microseconds(
      static_cast<std::int64_t>(milliseconds_field(frame, "cpu_ms", kDayMs) * 1000));
  // The state before the cell is no longer needed (unless it is a snapshot): the standby that
  // ran the cell is the checkpoint from now on, and forks the next standby.
  s_.release_checkpoint();
  s_.own_checkpoint_ = std::move(s_.standby_);
  s_.standby_ = Channel();
  s_.checkpoint_ = &s_.own_checkpoint_;
  s_.checkpoint_snapshot_.reset();
}

void Cell::rolled_back(const json& frame) {
  // null: the checkpoint saw the standby die without being asked.
  if (const auto& id = field(frame, "id"); !id.is_null() && id != json(id_))
    throw Error("a rollback report for another cell: " + describe_frame(frame));
  finished_ = true;
  s_.standby_.close();  // the checkpoint forks the next standby
  result_.rolled_back = true;
  if (timed_out_) {
    result_.status = CellStatus::timeout;
    result_.error = "the cell ran past its time limit of " + format_duration(limit_) +
                    "; the session was rolled back to before it";
    return;
  }
  const auto oom_after = s_.counters().oom_kills;
  if (oom_before_ && oom_after && *oom_after > *oom_before_) {
    result_.status = CellStatus::memory_limit;
    result_.error = "the cell was killed at the memory limit of " +
                    format_size(s_.policy_.limits.memory_bytes) +
                    "; the session was rolled back to before it";
    return;
  }
  result_.status = CellStatus::crashed;
  result_.error = describe_exit(frame) + "; the session was rolled back to before the cell";
}

}  // namespace rlm::session
