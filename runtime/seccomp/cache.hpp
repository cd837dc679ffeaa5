// Compiled payload filters, cached per policy so a run does not pay libseccomp's compile (about
// three quarters of a run's user-space CPU before this cache) when a filter for the same rules was
// compiled before. Internal to runtime/seccomp (and its tests); prepare_payload_filter() uses it.
//
// Two layers, both keyed by the exact canonical text of the policy's seccomp block
// (program_key()), never by a hash alone, so a policy can only ever get the programs compiled from
// rules identical to its own:
//   - in memory, per process (the library, a pool, a server): bounded to kMemoryEntries;
//   - on disk, for processes that live for one run (the CLI): one file per key in a directory only
//     root can write (kDiskDirectory, created 0700). Only when running as root; a directory or a
//     file that is not owned by us or is writable by anyone else is never read. A file names its
//     key in full, and the running executable's identity (device, inode, size, mtime, ctime) and
//     libseccomp's version are part of the on-disk key, so a rebuilt binary (a changed preamble)
//     or another libseccomp never reads an older program. RLM_SANDBOX_SECCOMP_CACHE=off disables
//     the disk layer.
// Each run still gets sealed memfds of its own, filled from the cached instructions.
#pragma once

#include <linux/filter.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::seccomp::cache {

// A payload's two programs (seccomp.hpp's PayloadFilter) as instructions.
struct Programs {
  std::vector<sock_filter> kill;
  std::vector<sock_filter> notify;  // empty: no notify program
};

inline constexpr std::size_t kMemoryEntries = 64;
inline constexpr std::size_t kDiskEntries = 256;  // a full directory loses its oldest files first
inline constexpr const char* kDiskDirectory = "/run/rlm-sandbox-seccomp";

// The canonical text of `rules`: every field, length-prefixed, in order. Equal texts mean equal
// rules and so equal programs.
std::string program_key(const Seccomp& rules);

// The cached programs for `key`, from memory or else from disk (then kept in memory too).
std::optional<Programs> find(const std::string& key);

// Keeps `programs` for `key` in memory and, where the disk layer is on, on disk. Best effort: a
// program that cannot be stored is simply compiled again next time.
void store(const std::string& key, const Programs& programs);

// For tests.
struct Stats {
  std::uint64_t memory_hits = 0;
  std::uint64_t disk_hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t disk_rejected = 0;  // files found for a key but not trusted or not matching it
};
Stats stats();
void clear_memory();
// The disk layer's directory ("" turns it off); the default is kDiskDirectory when running as root
// and RLM_SANDBOX_SECCOMP_CACHE is not "off".
void set_disk_directory(std::string directory);
// The file a key is stored in, relative to the directory.
std::string disk_file_name(const std::string& key);

}  // namespace rlm::seccomp::cache
