// The save file of a session (Session::save_to_fd, docs/sessions.md "Save and restore"): one line
// of JSON saying what made it and the SHA-256 and size of what follows, then the state as the
// worker wrote it. The host reads only the line and the digest; the state's content is read
// inside a sandbox. A file that fails any check is refused before a sandbox sees a byte of it.
#pragma once

#include <cstdint>
#include <string>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::session {

// What must match between the session that saved and the one that restores: the worker's script
// (the state's format) and the policy.
struct SaveIdentity {
  std::string worker;  // SHA-256 of the embedded worker, hex
  std::string policy;  // SHA-256 of the policy's JSON, hex
  std::string policy_name;
};
SaveIdentity save_identity(const Policy& policy);

// The most bytes of the header line.
inline constexpr std::size_t kMaxSaveHeaderBytes = 4096;

// Seals a memfd the sandbox has written (no more writing or growing, from any fd or mapping it
// kept) and returns its size. Throws Error: a writable mapping still open in the sandbox, a
// state above kMaxSavedStateBytes.
std::uint64_t seal_state(int memfd);
// Empties a state's memfd once the op that used it is done: a copy of its fd the sandbox kept
// then holds no memory of the host's.
void release_state(int memfd);
// Writes the header and the `size` sealed bytes of `state` to `out` from its offset; returns the
// file's size. Throws Error.
std::uint64_t write_save_file(int out, int state, std::uint64_t size, const SaveIdentity& identity);
// The state a save file holds, as the worker's load op takes it: `offset` bytes into `fd`.
struct SavedState {
  host::UniqueFd fd;
  std::uint64_t offset = 0;
};
// Whether `fd` is a memfd sealed against every change (as save files made by fork_session are).
bool fully_sealed(int fd);
// The state `in` (a regular file, read from offset 0) holds, once every check passed: a sealed
// memfd itself (a new fd of it: it cannot change after the check), any other file copied into
// a sealed memfd. Throws Error saying which check failed.
// A state of more than `room` bytes (the session's memory limit) is refused before it is read.
SavedState read_save_file(int in, const SaveIdentity& identity, std::uint64_t room);
// A new open file of `fd` (read-only, its own offset): an fd passed on as it is would share its
// offset with every other holder of it, and two sandboxes reading one state would race.
host::UniqueFd reopen_readonly(int fd);
// The header line's length of a save file made by this process (fork_session's own): no checks.
std::uint64_t trusted_header_length(int in);

}  // namespace rlm::session
