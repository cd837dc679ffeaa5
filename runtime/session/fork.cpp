// fork_session: a save made once into a sealed memfd, loaded by every branch concurrently.
#include <sys/mman.h>

#include <sys/stat.h>

#include <cerrno>
#include <mutex>
#include <thread>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/session.hpp"
#include "rlm_sys/sys.hpp"
#include "session/save_file.hpp"
#include "session/worker_session.hpp"

namespace rlm {

Forked fork_session(Session& parent, std::size_t count, const OpenBranch& open_branch) {
  if (count == 0 || count > kMaxForkBranches)
    throw Error("a fork makes 1 to " + std::to_string(kMaxForkBranches) + " branches, not " +
                std::to_string(count));
  if (!open_branch) throw Error("a fork needs a way to open its branches");
  // The state: from a session of this process's own its sealed memfd as the worker wrote it
  // (no framing, no copy, no digest: nothing but this process has it); else a save file.
  Forked forked;
  host::UniqueFd state, file;
  std::uint64_t header = 0;
  if (auto* worker = dynamic_cast<session::WorkerSession*>(&parent)) {
    auto sealed = worker->save_state();
    forked.saved = std::move(sealed.result);
    state = std::move(sealed.fd);
  } else {
    file = host::UniqueFd(memfd_create("rlm-sandbox-fork", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!file) throw Error("memfd_create: " + sys::errno_text(errno));
    forked.saved = parent.save_to_fd(file.get());
  }
  if (forked.saved.status != CellStatus::ok)
    throw Error("the session's state could not be saved for the fork: " +
                (forked.saved.error.empty() ? std::string(to_string(forked.saved.status))
                                            : forked.saved.error));
  // A save file, made once, for branches that are no session of this process's own.
  std::once_flag framed;
  const auto save_file = [&]() -> int {
    std::call_once(framed, [&] {
      if (!file) {
        file = host::UniqueFd(memfd_create("rlm-sandbox-fork", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        if (!file) throw Error("memfd_create: " + sys::errno_text(errno));
        auto* worker = dynamic_cast<session::WorkerSession*>(&parent);
        struct stat info {};
        fstat(state.get(), &info);
        session::write_save_file(file.get(), state.get(), static_cast<std::uint64_t>(info.st_size),
                                 worker->identity());
      }
      session::seal_state(file.get());
      header = session::trusted_header_length(file.get());
    });
    return file.get();
  };

  std::vector<std::unique_ptr<Session>> branches(count);
  std::vector<std::string> errors(count);
  const auto make = [&](std::size_t index) {
    try {
      auto branch = open_branch(index);
      if (!branch) throw Error("no session was opened");
      // A branch of this process's own loads the sealed state as it is; any other the file.
      auto* worker = dynamic_cast<session::WorkerSession*>(branch.get());
      const host::UniqueFd own =
          session::reopen_readonly(worker && state ? state.get() : save_file());
      const CellResult loaded = worker ? worker->load_state(own.get(), state ? 0 : header)
                                       : branch->load_from_fd(own.get());
      if (loaded.status != CellStatus::ok)
        throw Error(loaded.error.empty() ? std::string(to_string(loaded.status)) : loaded.error);
      branches[index] = std::move(branch);
    } catch (const std::exception& error) {
      errors[index] = error.what();
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t index = 1; index < count; ++index) threads.emplace_back(make, index);
  make(0);
  for (auto& thread : threads) thread.join();
  // Every branch has read it: an fd of it a sandbox kept holds no memory from now on.
  session::release_state(state.get());
  session::release_state(file.get());
  for (std::size_t index = 0; index < count; ++index) {
    if (errors[index].empty()) continue;
    for (auto& branch : branches)
      if (branch) branch->close();
    throw Error("branch " + std::to_string(index) + " of the fork failed: " + errors[index]);
  }
  forked.branches = std::move(branches);
  return forked;
}

}  // namespace rlm
