// Who a container belongs to. Every container the docker backend makes carries the labels below,
// so a later process can find the ones a crashed runtime left and remove only those: the owner is
// a run id (cgroup/run_id.hpp: pid, its start time, its PID namespace) plus the boot id,
// and a container is collected only when its owner is certainly gone.
#pragma once

#include <string>
#include <string_view>

namespace rlm::docker {

inline constexpr std::string_view kManagedLabel = "rlm-sandbox";          // always "1"
inline constexpr std::string_view kSessionLabel = "rlm-sandbox.session";  // one-shot run or session
inline constexpr std::string_view kOwnerLabel = "rlm-sandbox.owner";      // the creating process
inline constexpr std::string_view kBootLabel = "rlm-sandbox.boot";        // its boot id

// A fresh id owned by this process, unique within it: the container's name suffix and, for a
// one-shot run, its session label.
std::string new_owned_id();

// /proc/sys/kernel/random/boot_id, "" when unreadable.
std::string boot_id();

enum class OwnerState { alive, dead, unknown };
// From a container's owner and boot labels. A different boot means dead; a pid in another PID
// namespace or an unparsable label means unknown (never touched).
OwnerState owner_state(std::string_view owner_label, std::string_view boot_label);

}  // namespace rlm::docker
