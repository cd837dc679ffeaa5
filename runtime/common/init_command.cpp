#include "common/init_command.hpp"

#include <iterator>

#include "rlm_init/protocol.hpp"

namespace rlm::common {

std::vector<std::string> init_arguments(const std::string& init_path, InitSettings settings) {
  namespace protocol = init_protocol;
  std::vector<std::string> args{init_path, protocol::kReportFdFlag,
                                std::to_string(protocol::kReportFd), protocol::kGraceFlag,
                                std::to_string(settings.grace.count())};
  for (const auto& limit : settings.rlimits) {
    args.push_back(protocol::kRlimitFlag);
    args.push_back(limit);
  }
  if (!settings.workdir.empty()) {
    args.push_back(protocol::kChdirFlag);
    args.push_back(settings.workdir);
  }
  if (settings.seccomp_fd >= 0) {
    args.push_back(protocol::kSeccompFdFlag);
    args.push_back(std::to_string(settings.seccomp_fd));
  }
  if (settings.seccomp_notify_fd >= 0) {
    args.push_back(protocol::kSeccompNotifyFdFlag);
    args.push_back(std::to_string(settings.seccomp_notify_fd));
  }
  if (settings.guard_signals) args.push_back(protocol::kGuardSignalsFlag);
  if (settings.pid1) args.push_back(protocol::kPid1Flag);
  args.push_back("--");
  args.insert(args.end(), std::make_move_iterator(settings.payload_argv.begin()),
              std::make_move_iterator(settings.payload_argv.end()));
  return args;
}

}  // namespace rlm::common
