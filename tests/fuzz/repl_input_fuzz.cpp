// libFuzzer harness for the repl's JSON-lines input (issue 11): arbitrary bytes go through the
// same LineSplitter and parse_repl_request the repl's reader thread uses. Beyond the sanitizers,
// it checks what the repl relies on: a request's id and every error's id is safe to echo (null, a
// bounded string or an integer), an error message is short, a timeout is within the limit, and a
// line over the bound is never handed on whole.
// Build: clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -I runtime
//        tests/fuzz/repl_input_fuzz.cpp runtime/repl/request.cpp
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "repl/request.hpp"

namespace {

using rlm::repl::ReplRequest;
using rlm::repl::ReplRequestError;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

bool echoable(const nlohmann::json& id) {
  return id.is_null() || id.is_number_integer() ||
         (id.is_string() && id.get_ref<const std::string&>().size() <= rlm::repl::kMaxReplIdBytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The first byte picks a small line bound, so inputs reach the overlong path too.
  if (size == 0) return 0;
  rlm::repl::ReplInputLimits limits;
  limits.max_line_bytes = 16 + data[0] * 64u;
  limits.max_timeout = std::chrono::milliseconds(60'000);
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  rlm::repl::LineSplitter splitter(limits.max_line_bytes);
  const auto on_line = [&](std::string_view line, bool overlong) {
    check(line.size() <= limits.max_line_bytes);
    if (overlong || rlm::repl::blank_line(line)) return;
    const auto parsed = rlm::repl::parse_repl_request(line, limits);
    if (const auto* error = std::get_if<ReplRequestError>(&parsed)) {
      check(echoable(error->id));
      check(!error->message.empty() && error->message.size() < 512);
      (void)error->id.dump();
      return;
    }
    const auto& request = std::get<ReplRequest>(parsed);
    check(echoable(request.id));
    (void)request.id.dump();
    if (request.timeout)
      check(request.timeout->count() >= 1 && *request.timeout <= limits.max_timeout);
    if (request.op == rlm::repl::ReplOp::llm_result)
      check(request.text.has_value() + request.error.has_value() + request.value.has_value() == 1);
    if (request.fetch)
      check(!request.fetch->empty() && request.fetch->size() <= rlm::repl::kMaxReplFetchBytes);
    if (request.op == rlm::repl::ReplOp::add_context)
      check(request.context_file.empty() || request.context.is_null());
    if (request.op == rlm::repl::ReplOp::add_history) check(request.context.is_array());
    (void)request.context.dump();  // depth-bounded: cannot exhaust the stack
    if (request.value) (void)request.value->dump();
  };
  // Fed in two pieces, so a line split across reads is exercised.
  const std::size_t half = input.size() / 2;
  splitter.feed(input.substr(0, half), on_line);
  splitter.feed(input.substr(half), on_line);
  splitter.finish(on_line);
  return 0;
}
