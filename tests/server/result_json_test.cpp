// result_from_json and cell_result_from_json read back what to_json printed (the server's client
// rebuilds Results from them), and refuse documents of another shape.
#include <gtest/gtest.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {
namespace {

TEST(ResultJson, RoundTripsEveryField) {
  Result result;
  result.status = Status::output_limit;
  result.exit_code = -1;
  result.signal = 9;
  result.detail = "stdout exceeded";
  result.stdout_data = "out";
  result.stderr_data = "err";
  result.stdout_truncated = true;
  result.wall = std::chrono::microseconds(1234567);
  result.cpu = std::chrono::microseconds(89);
  result.peak_memory_bytes = 1u << 20;
  result.backend = "namespace";
  result.policy = "default";
  result.unenforced = {"limits.pids"};
  const Result back = result_from_json(result.to_json());
  EXPECT_EQ(back.to_json(), result.to_json());
}

TEST(ResultJson, RefusesOtherShapes) {
  EXPECT_THROW(result_from_json(nlohmann::json::array()), Error);
  EXPECT_THROW(result_from_json({{"status", "exploded"}}), Error);
  EXPECT_THROW(result_from_json({{"status", "ok"}, {"exit_code", "0"}}), Error);
  EXPECT_THROW(result_from_json({{"status", "ok"}, {"wall_ms", -1}}), Error);
}

TEST(CellResultJson, RoundTripsEveryField) {
  CellResult cell;
  cell.status = CellStatus::timeout;
  cell.stdout_data = "o";
  cell.stderr_data = "e";
  cell.stderr_truncated = true;
  cell.error = "too slow";
  cell.final = nlohmann::json{{"answer", 42}};
  cell.wall = std::chrono::microseconds(5000);
  cell.cpu = std::chrono::microseconds(2500);
  cell.llm_calls = 3;
  cell.rolled_back = true;
  EXPECT_EQ(cell_result_from_json(cell.to_json()).to_json(), cell.to_json());
  cell.answer = "done";
  cell.locals = nlohmann::json::parse(R"([{"name": "x", "type": "int", "repr": "1"}])");
  cell.fetched = nlohmann::json{{"value", {1, 2}}};
  cell.index = 3;
  const auto round = cell_result_from_json(cell.to_json());
  EXPECT_EQ(round.to_json(), cell.to_json());
  EXPECT_EQ(round.answer, "done");
  EXPECT_EQ(round.index, 3u);
  CellResult no_final;
  no_final.status = CellStatus::ok;
  const auto plain = cell_result_from_json(no_final.to_json());
  EXPECT_FALSE(plain.final.has_value());
  EXPECT_FALSE(plain.answer || plain.locals || plain.fetched || plain.index);
  for (const char* key : {"answer", "locals", "fetched", "index"})
    EXPECT_FALSE(no_final.to_json().contains(key)) << key << " only when set";
}

TEST(CellResultJson, RefusesOtherShapes) {
  EXPECT_THROW(cell_result_from_json({{"status", "fine"}}), Error);
  EXPECT_THROW(cell_result_from_json({{"status", "ok"}, {"llm_calls", -1}}), Error);
  EXPECT_THROW(cell_result_from_json({{"status", "ok"}, {"answer", 1}}), Error);
  EXPECT_THROW(cell_result_from_json({{"status", "ok"}, {"locals", "x"}}), Error);
  EXPECT_THROW(cell_result_from_json({{"status", "ok"}, {"fetched", 1}}), Error);
  EXPECT_THROW(cell_result_from_json({{"status", "ok"}, {"index", -1}}), Error);
}

}  // namespace
}  // namespace rlm
