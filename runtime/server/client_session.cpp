// A session relayed to the server: each call is one frame and its answer; the cell's llm_call
// frames are answered by the caller's LlmHandler, from whatever thread it answers on.
#include <sys/socket.h>

#include <atomic>
#include <mutex>

#include "host/context_fd.hpp"
#include "server/client_state.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

class RelayedSession final : public Session {
 public:
  RelayedSession(UniqueFd socket, SessionOptions options, std::string node)
      : node_(std::move(node)),
        socket_(std::move(socket)),
        outbox_(std::make_shared<SharedSender>(socket_.get(), kReplyTimeout)),
        llm_(options.llm ? limit_llm_handler(std::move(options.llm), options.llm_limits)
                         : nullptr) {}
  ~RelayedSession() override { close(); }

  std::string_view backend() const override { return "server"; }
  std::string node() const override { return node_; }

  using Session::execute;
  CellResult execute(const std::string& code, const ExecuteOptions& options) override {
    json frame{{"op", "execute"}, {"code", code}};
    if (options.timeout) frame["timeout_ms"] = options.timeout->count();
    if (options.locals) frame["locals"] = true;
    if (options.fetch) frame["fetch"] = *options.fetch;
    return cell(frame, {});
  }

  CellResult add_context(ContextKind kind, const ContextInput& input,
                         std::optional<std::size_t> index) override {
    const UniqueFd fd = host::open_context_fd(input.file, input.data);
    const int number = fd.get();
    json frame{{"op", "add_context"},
               {"kind", kind == ContextKind::context ? "context" : "history"},
               {"format", input.is_json ? "json" : "text"},
               {"index", index ? json(*index) : json()}};
    return cell(frame, std::span<const int>(&number, 1));
  }

  CellResult save_to_fd(int fd) override { return cell({{"op", "save"}}, std::span(&fd, 1)); }
  CellResult load_from_fd(int fd) override { return cell({{"op", "load"}}, std::span(&fd, 1)); }

  SnapshotId snapshot() override {
    const json reply = call({{"op", "snapshot"}}, nullptr);
    if (reply["op"] != "snapshot" || !reply.value("id", json()).is_number_unsigned())
      throw Error("the server answered out of turn");
    return reply["id"].get<SnapshotId>();
  }

  void restore(SnapshotId id) override {
    const json reply = call({{"op", "restore"}, {"id", id}}, nullptr);
    if (reply["op"] != "restored") throw Error("the server answered out of turn");
  }

  void narrow_network(const std::vector<std::string>& entries) override {
    const json reply = call({{"op", "narrow_network"}, {"allow", entries}}, nullptr);
    if (reply["op"] != "narrowed") throw Error("the server answered out of turn");
  }

  Result close() override {
    if (closed_) return *closed_;
    Result result;
    result.backend = "server";
    if (ended_.empty()) {
      try {
        const json reply = call({{"op", "close"}}, nullptr);
        if (reply["op"] == "closed" && reply.contains("result"))
          result = result_from_json(reply["result"]);
      } catch (const Error& error) {
        result.detail = error.what();
      }
    } else {
      result.detail = ended_;
    }
    ended_ = "the session was closed";
    outbox_->detach();
    {
      std::lock_guard lock(socket_mutex_);
      socket_.reset();
    }
    closed_ = result;
    return result;
  }

  std::string ended() const override { return ended_; }

  // The server ends the session once its connection is gone.
  void kill(const std::string&) override {
    std::lock_guard lock(socket_mutex_);
    if (socket_) shutdown(socket_.get(), SHUT_RDWR);
  }

 private:
  // A cell (execute, add_context): its frame, its result; a lost connection is a session_error.
  CellResult cell(const json& frame, std::span<const int> fds) {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    try {
      const json reply = call(frame, cancelled, fds);
      cancelled->store(true);
      if (reply["op"] != "cell_result" || !reply.contains("result"))
        throw Error("the server answered out of turn");
      return cell_result_from_json(reply["result"]);
    } catch (const ServerRefused& refused) {
      cancelled->store(true);
      if (!ended_.empty()) {
        CellResult lost;
        lost.status = CellStatus::session_error;
        lost.error = ended_;
        return lost;
      }
      throw Error(refused.what());
    }
  }

  // Sends `frame` and answers llm_call frames until the reply to it arrives. Throws Error for an
  // error frame (the session goes on) and ServerRefused when the connection ends (it does not).
  json call(const json& frame, const std::shared_ptr<std::atomic<bool>>& cancelled,
            std::span<const int> fds = {}) {
    if (!ended_.empty()) throw Error("the session is over: " + ended_);
    if (!outbox_->send(frame, fds)) {  // a cell turns it into a session_error
      ended_ = node_lost("its connection is closed");
      throw ServerRefused("node_lost", "the session is over: " + ended_);
    }
    for (;;) {
      json reply;
      try {
        reply = server_reply(socket_.get(), Clock::time_point::max());
      } catch (const ConnectionLost& lost) {
        // The connection ended with no answer: the node (or the way to it) is gone.
        ended_ = node_lost(lost.what());
        outbox_->detach();
        throw ServerRefused("node_lost", "the session is over: " + ended_);
      } catch (const ServerRefused& refused) {
        if (refused.kind() == "unavailable") {  // the server ended the session, saying why
          ended_ = refused.what();
          outbox_->detach();
          throw;
        }
        throw Error(refused.what());  // an error frame: this request failed, the session goes on
      }
      if (reply["op"] != "llm_call") return reply;
      answer(reply, cancelled);
    }
  }

  // Why the session ended when its node went away without a word (docs/fleet.md).
  std::string node_lost(const std::string& how) const {
    return "node_lost: " + (node_.empty() ? std::string("the server") : "node " + node_) +
           " is gone (" + how + ")";
  }

  void answer(const json& call_frame, const std::shared_ptr<std::atomic<bool>>& cancelled) {
    const json id = call_frame.value("id", json());
    if (!id.is_number_unsigned()) return;
    std::weak_ptr<SharedSender> outbox = outbox_;
    auto reply = [outbox, id](LlmAnswer answer) {
      if (auto box = outbox.lock()) {
        json frame{{"op", "llm_answer"}, {"id", id}};
        if (answer.text)
          frame["text"] = *answer.text;
        else
          frame["error"] = answer.error;
        box->send(frame);
      }
    };
    if (!llm_) return reply(LlmAnswer::of_error("no LM handler in this session"));
    LlmCall call;
    call.prompt = call_frame.value("prompt", json()).is_string()
                      ? call_frame.value("prompt", std::string())
                      : "";
    call.prompt_is_json = call_frame.value("prompt_is_json", json()) == json(true);
    if (const json model = call_frame.value("model", json()); model.is_string())
      call.model = model.get<std::string>();
    const json kind = call_frame.value("kind", json());
    if (kind == "rlm") call.kind = CallKind::rlm;
    if (kind == "tool") call.kind = CallKind::tool;
    if (const json tool = call_frame.value("tool", json()); tool.is_string())
      call.tool = tool.get<std::string>();
    call.cancelled = cancelled;
    llm_->answer(std::move(call), std::move(reply));
  }

  const std::string node_;
  std::mutex socket_mutex_;  // kill() against close()'s reset
  UniqueFd socket_;
  std::shared_ptr<SharedSender> outbox_;
  std::shared_ptr<LlmHandler> llm_;
  std::string ended_;
  std::optional<Result> closed_;
};

}  // namespace

std::unique_ptr<Session> make_relayed_session(UniqueFd socket, SessionOptions options,
                                              std::string node) {
  return std::make_unique<RelayedSession>(std::move(socket), std::move(options), std::move(node));
}

}  // namespace rlm::server
