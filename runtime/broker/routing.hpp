// Routing a cell's llm_query calls to the session's LM handler and the answers back: the host side
// of the control channel's LM traffic (docs/control-channel.md). The session reads and checks each
// query frame and hands it to the cell's CellCalls, which gives every prompt to the handler; the
// handler answers on threads of its own into the session's AnswerQueue, whose eventfd wakes the
// session's poll loop; the loop collects the answers and gets back the reply frames (llm_result,
// llm_results) of the calls they complete. Nothing here blocks, and every byte a call keeps on the
// host is counted for the session's buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/llm.hpp"

namespace rlm::broker {

// One prompt of a query: text, or the JSON text of a message list or a tool's arguments.
struct Prompt {
  std::string text;
  bool is_json = false;
};

// One llm_query or llm_query_batched frame, as the session has read and checked it.
struct Query {
  nlohmann::json id;  // the worker's id for the call, echoed in the reply
  bool batched = false;
  std::optional<std::string> model;
  CallKind kind = CallKind::llm;
  std::string tool;             // kind == tool
  std::vector<Prompt> prompts;  // exactly one unless batched
  // Set: every prompt is answered with this error at once, without reaching the handler (a call
  // of a tool the session does not have).
  std::optional<std::string> refusal;
};

// The LM handler's answers, queued on the handler's threads for the session's poll loop, which
// the eventfd wakes. Shared with the handler's callbacks, so a late answer after the session is
// gone lands harmlessly.
class AnswerQueue {
 public:
  struct Item {
    std::uint64_t generation;  // the cell's (CellCalls)
    std::uint64_t call;        // the cell's call number
    std::size_t index;         // the item of a batch (0 for a single query)
    LlmAnswer answer;
  };

  // One prompt's bytes, charged while the handler holds the call: released when it answers, or
  // when it drops the callback unanswered.
  class Charge {
   public:
    Charge(std::shared_ptr<AnswerQueue> queue, std::uint64_t bytes);
    ~Charge() { release(); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    void release() { queue_->at_handler_ -= bytes_.exchange(0); }

   private:
    std::shared_ptr<AnswerQueue> queue_;
    std::atomic<std::uint64_t> bytes_;
  };

  // Throws Error when the eventfd cannot be made.
  AnswerQueue();

  // Readable while answers are queued.
  int event_fd() const { return event_.get(); }
  void push(Item item);
  std::deque<Item> take();
  // Bytes of prompts handed to the handler and not answered yet, of this cell or an earlier one
  // (a handler that ignores cancellation holds them on): they count against the session's buffer.
  std::uint64_t at_handler() const { return at_handler_.load(); }
  // A number for the next cell's calls; only the session's thread asks.
  std::uint64_t next_generation() { return ++generations_; }

 private:
  std::mutex mutex_;
  std::deque<Item> items_;
  host::UniqueFd event_;
  std::atomic<std::uint64_t> at_handler_{0};
  std::uint64_t generations_ = 0;
};

// One cell's calls, from its queries to the replies. An answer for a call of an earlier cell (an
// interpreter since rolled back, a cell that ended with calls open) is dropped.
class CellCalls {
 public:
  // Per open call, charged to the session's buffer besides its prompt: what the host keeps for it.
  static constexpr std::uint64_t kCallOverhead = 1024;

  // `handler` may be null: then every call is answered with an error.
  CellCalls(std::shared_ptr<AnswerQueue> queue, std::shared_ptr<LlmHandler> handler);
  CellCalls(const CellCalls&) = delete;
  CellCalls& operator=(const CellCalls&) = delete;

  // Gives each prompt to the handler (a handler that throws has answered with the error). The
  // reply at once for a batch of no prompts, else nullopt: the answers come through the queue.
  // A tool's answer that is not JSON text becomes an error.
  std::optional<nlohmann::json> ask(Query query);
  // Takes the queued answers; the reply frames of the calls they complete, in order.
  std::vector<nlohmann::json> collect();
  // Calls asked and not yet replied to.
  std::size_t open() const { return calls_.size(); }
  // Bytes held on the host for the calls: prompts at the handler (an earlier cell's included) and
  // answers collected for calls not complete yet.
  std::uint64_t in_flight() const { return queue_->at_handler() + held_answers_; }
  // The cell has ended: the handler drops what it has not started (LlmCall::cancelled).
  void cancel() { cancelled_->store(true); }

 private:
  struct OpenCall {
    nlohmann::json query_id;
    bool batched;
    std::vector<std::optional<LlmAnswer>> items;
    std::size_t missing;
    std::uint64_t held;  // answer bytes received so far
  };

  nlohmann::json finish(std::uint64_t number);

  std::shared_ptr<AnswerQueue> queue_;
  std::shared_ptr<LlmHandler> handler_;
  std::uint64_t generation_;
  std::uint64_t next_call_ = 1;
  std::map<std::uint64_t, OpenCall> calls_;
  std::uint64_t held_answers_ = 0;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace rlm::broker
