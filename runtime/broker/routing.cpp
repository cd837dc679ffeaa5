#include "broker/routing.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <utility>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::broker {
namespace {

using nlohmann::json;

std::uint64_t answer_bytes(const LlmAnswer& answer) {
  return (answer.text ? answer.text->size() : 0) + answer.error.size();
}

json answer_json(LlmAnswer& answer) {
  return answer.text ? json{{"text", std::move(*answer.text)}}
                     : json{{"error", std::move(answer.error)}};
}

}  // namespace

AnswerQueue::Charge::Charge(std::shared_ptr<AnswerQueue> queue, std::uint64_t bytes)
    : queue_(std::move(queue)), bytes_(bytes) {
  queue_->at_handler_ += bytes_;
}

AnswerQueue::AnswerQueue() : event_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!event_) throw Error("eventfd: " + sys::errno_text(errno));
}

void AnswerQueue::push(Item item) {
  {
    std::lock_guard lock(mutex_);
    items_.push_back(std::move(item));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t ignored = write(event_.get(), &one, sizeof one);
}

std::deque<AnswerQueue::Item> AnswerQueue::take() {
  std::uint64_t count;
  [[maybe_unused]] const ssize_t ignored = read(event_.get(), &count, sizeof count);
  std::lock_guard lock(mutex_);
  return std::exchange(items_, {});
}

CellCalls::CellCalls(std::shared_ptr<AnswerQueue> queue, std::shared_ptr<LlmHandler> handler)
    : queue_(std::move(queue)),
      handler_(std::move(handler)),
      generation_(queue_->next_generation()) {}

std::optional<json> CellCalls::ask(Query query) {
  const auto call = next_call_++;
  const std::size_t count = query.prompts.size();
  calls_[call] = OpenCall{std::move(query.id), query.batched,
                          std::vector<std::optional<LlmAnswer>>(count), count, 0};
  if (count == 0) return finish(call);
  const bool tool = query.kind == CallKind::tool;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bytes = query.prompts[i].text.size() + query.tool.size() +
                                (query.model ? query.model->size() : 0) + kCallOverhead;
    auto charge = std::make_shared<AnswerQueue::Charge>(queue_, bytes);
    auto done = [queue = queue_, charge, generation = generation_, call, i,
                 tool](LlmAnswer answer) {
      // On the handler's thread: the check costs the session's loop nothing.
      if (tool && answer.text && !json::accept(*answer.text))
        answer = LlmAnswer::of_error("the tool's answer is not JSON text");
      charge->release();
      queue->push({generation, call, i, std::move(answer)});
    };
    if (query.refusal) {
      done(LlmAnswer::of_error(*query.refusal));
      continue;
    }
    if (!handler_) {
      done(LlmAnswer::of_error("no LM handler is configured for this session"));
      continue;
    }
    LlmCall asked;
    asked.prompt = std::move(query.prompts[i].text);
    asked.prompt_is_json = query.prompts[i].is_json;
    asked.model = query.model;
    asked.cancelled = cancelled_;
    asked.kind = query.kind;
    asked.tool = query.tool;
    try {
      handler_->answer(std::move(asked), done);
    } catch (const std::exception& error) {
      done(LlmAnswer::of_error(error.what()));
    }
  }
  return std::nullopt;
}

std::vector<json> CellCalls::collect() {
  std::vector<json> replies;
  for (auto& item : queue_->take()) {
    if (item.generation != generation_) continue;  // for an interpreter rolled back since
    const auto call = calls_.find(item.call);
    if (call == calls_.end() || item.index >= call->second.items.size() ||
        call->second.items[item.index])
      continue;
    const auto bytes = answer_bytes(item.answer);
    held_answers_ += bytes;
    call->second.held += bytes;
    call->second.items[item.index] = std::move(item.answer);
    if (--call->second.missing == 0) replies.push_back(finish(item.call));
  }
  return replies;
}

json CellCalls::finish(std::uint64_t number) {
  auto& call = calls_.at(number);
  json reply;
  if (call.batched) {
    json items = json::array();
    for (auto& item : call.items) items.push_back(answer_json(*item));
    reply = {{"op", "llm_results"}, {"id", call.query_id}, {"items", std::move(items)}};
  } else {
    reply = answer_json(*call.items.front());
    reply["op"] = "llm_result";
    reply["id"] = call.query_id;
  }
  held_answers_ -= call.held;
  calls_.erase(number);
  return reply;
}

}  // namespace rlm::broker
