// Runs a program the way a user or script would, for tests that exercise binaries end to end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::test {

struct ProcessOutcome {
  pid_t pid = -1;       // the process, once started
  int exit_code = -1;   // when it exited
  int term_signal = 0;  // when a signal ended it
  std::string out, err;
  std::chrono::milliseconds wall{0};
  std::uint64_t max_rss_bytes = 0;  // peak RSS of the process and the descendants it reaped
};

struct ProcessOptions {
  std::string stdin_data;
  std::map<std::string, std::string> extra_env;   // added to the test's own environment
  std::string workdir;                            // "" keeps the current one
  std::chrono::milliseconds kill_after{120'000};  // a hung binary fails the test, never hangs it
};

ProcessOutcome run_process(const std::vector<std::string>& argv,
                           const ProcessOptions& options = {});

// Built binaries: bin_path("rlm-sandbox"), bin_path("rlm-sandbox-init").
std::string bin_path(const std::string& name);
// Files of the source tree: source_path("policies/default.json").
std::string source_path(const std::string& relative);

// Everything readable from `fd` until EOF (a blocking read loop; the fd stays open).
std::string read_to_eof(int fd);

// True when a process with this pid exists (zombies count as gone).
bool process_alive(pid_t pid);

// Reads `fd` into `seen` until it holds `text`, the fd ends, or `limit` passes (each poll is
// short, so a slow writer is waited for); true when `seen` holds `text`.
bool read_until(int fd, std::string& seen, std::string_view text, std::chrono::milliseconds limit);

// A child the test started, with the read end of a pipe from it: on destruction the child, if
// still the test's, is SIGKILLed and reaped, and the pipe closed.
struct ChildWithPipe {
  pid_t pid = -1;
  int from = -1;
  ChildWithPipe() = default;
  ~ChildWithPipe();
  ChildWithPipe(const ChildWithPipe&) = delete;
  ChildWithPipe& operator=(const ChildWithPipe&) = delete;
};

// A fresh directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, const std::string& content) const;
  std::string read(const std::string& name) const;

 private:
  std::string path_;
};

}  // namespace rlm::test
