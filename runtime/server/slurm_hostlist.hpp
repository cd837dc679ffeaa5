// A Slurm job's node list, as Slurm writes it in SLURM_JOB_NODELIST, expanded to host names:
// "node[01-03,07],gpu5,rack[1-2]-n[1-2]" is node01 node02 node03 node07 gpu5 rack1-n1 rack1-n2
// rack2-n1 rack2-n2 (a range keeps its lower bound's digits: 01-03 is 01, 02, 03).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::server {

// The hosts of `list`, in its order. Throws Error for a malformed list (an unclosed bracket, a
// range that runs backwards or is not digits, a name with characters no host name has) and for
// one of more than `max_hosts` hosts (checked before any is made: "n[0-999999999]" costs nothing).
std::vector<std::string> expand_slurm_hostlist(std::string_view list, std::size_t max_hosts);

}  // namespace rlm::server
