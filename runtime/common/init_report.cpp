#include "common/init_report.hpp"

#include <nlohmann/json.hpp>

#include "rlm_init/protocol.hpp"

namespace rlm::common {
namespace {

int integer(const nlohmann::json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_number_integer() ? it->get<int>() : 0;
}

std::string text(const nlohmann::json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

InitReport parse_init_report(std::string_view line) {
  namespace protocol = init_protocol;
  InitReport report;
  const auto newline = line.find('\n');
  const auto document = nlohmann::json::parse(line.substr(0, newline), nullptr, false);
  if (!document.is_object()) return report;

  const auto has = [&](const char* key) { return document.contains(key); };
  if (has(protocol::kExitCodeKey)) {
    report.kind = InitReport::Kind::exited;
    report.value = integer(document, protocol::kExitCodeKey);
  } else if (has(protocol::kSignalKey)) {
    report.kind = InitReport::Kind::signaled;
    report.value = integer(document, protocol::kSignalKey);
  } else if (has(protocol::kExecErrnoKey)) {
    report.kind = InitReport::Kind::exec_failed;
    report.value = integer(document, protocol::kExecErrnoKey);
  } else if (has(protocol::kSetupErrnoKey)) {
    report.kind = InitReport::Kind::setup_failed;
    report.value = integer(document, protocol::kSetupErrnoKey);
  } else if (has(protocol::kInitErrorKey)) {
    report.kind = InitReport::Kind::init_failed;
    report.message = text(document, protocol::kInitErrorKey);
  } else if (has(protocol::kInitExecErrnoKey)) {
    report.kind = InitReport::Kind::init_exec_failed;
    report.value = integer(document, protocol::kInitExecErrnoKey);
  }
  if (const auto cpu = document.find(protocol::kCpuKey);
      cpu != document.end() && cpu->is_number_integer())
    report.cpu = std::chrono::microseconds(cpu->get<long long>());
  report.step = text(document, protocol::kStepKey);
  report.path = text(document, protocol::kPathKey);
  const auto terminated = document.find(protocol::kTerminatedKey);
  report.terminated =
      terminated != document.end() && terminated->is_boolean() && terminated->get<bool>();
  const auto by_payload = document.find(protocol::kTerminatedByPayloadKey);
  report.terminated_by_payload =
      by_payload != document.end() && by_payload->is_boolean() && by_payload->get<bool>();
  if (const auto violation = document.find(protocol::kSeccompViolationKey);
      violation != document.end() && violation->is_number_integer())
    report.seccomp_syscall = violation->get<int>();
  return report;
}

}  // namespace rlm::common
