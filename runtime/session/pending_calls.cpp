#include "session/pending_calls.hpp"

namespace rlm::session {

std::optional<std::uint64_t> PendingCalls::add(const LlmCall& call,
                                               std::function<void(LlmAnswer)> done) {
  std::string refusal;
  {
    std::lock_guard lock(mutex_);
    if (!closed_ && !call.is_cancelled()) {
      const auto id = next_id_++;
      pending_[id] = Pending{std::move(done), call.kind == CallKind::tool};
      return id;
    }
    refusal = closed_ ? closed_message_ : "the cell that asked has ended";
  }
  done(LlmAnswer::of_error(refusal));
  return std::nullopt;
}

bool PendingCalls::complete(
    std::uint64_t id, const std::function<std::optional<LlmAnswer>(bool is_tool)>& answer_for) {
  std::function<void(LlmAnswer)> done;
  std::optional<LlmAnswer> answer;
  {
    std::lock_guard lock(mutex_);
    auto found = pending_.find(id);
    if (found == pending_.end()) return false;
    answer = answer_for(found->second.tool);
    if (!answer) return true;
    done = std::move(found->second.done);
    pending_.erase(found);
  }
  done(std::move(*answer));
  return true;
}

bool PendingCalls::complete(std::uint64_t id, LlmAnswer answer) {
  return complete(id, [&](bool) -> std::optional<LlmAnswer> { return std::move(answer); });
}

void PendingCalls::close() {
  std::map<std::uint64_t, Pending> pending;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    pending.swap(pending_);
  }
  for (auto& [id, call] : pending) call.done(LlmAnswer::of_error(closed_message_));
}

}  // namespace rlm::session
