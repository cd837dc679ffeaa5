// LM calls handed to someone else to answer (the repl's orchestrator over llm_query lines, the
// server's client over llm_call frames): each call gets an id, the answer carrying that id
// completes it, and closing fails every call still open. The repl and the server share this table.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "rlm_sandbox/llm.hpp"

namespace rlm::session {

class PendingCalls {
 public:
  // `closed_message`: the error every call gets once the answering side is gone.
  explicit PendingCalls(std::string closed_message) : closed_message_(std::move(closed_message)) {}

  // Holds `done` under a new id; nullopt after answering it with an error when the table is
  // closed or the cell that asked has ended.
  std::optional<std::uint64_t> add(const LlmCall& call, std::function<void(LlmAnswer)> done);

  // Completes call `id` with `answer_for(is_tool)`; when that gives nullopt the call keeps
  // waiting. False when no call waits with this id.
  bool complete(std::uint64_t id,
                const std::function<std::optional<LlmAnswer>(bool is_tool)>& answer_for);
  bool complete(std::uint64_t id, LlmAnswer answer);

  // Fails every open call, and every later one, with the closed message.
  void close();

 private:
  struct Pending {
    std::function<void(LlmAnswer)> done;
    bool tool = false;
  };

  const std::string closed_message_;
  std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Pending> pending_;
  bool closed_ = false;
};

}  // namespace rlm::session
