// `run -t`: the payload's stdio is a pseudo-terminal, relayed to this process's own stdio while
// the run goes on, as `docker run -t` does. The payload leads a session with it as its
// controlling terminal (rlm-sandbox-init), so a shell or REPL prompts, Ctrl-C and Ctrl-Z reach it
// through the terminal's line discipline, and a resize of this terminal is passed on.
//
// While it relays, a terminal on this side is in raw mode (every key goes to the payload's
// terminal, which interprets it); it is put back when the relay ends, also on an error.
#pragma once

#include <array>
#include <thread>

#include <termios.h>

namespace rlm::cli {

class PayloadTerminal {
 public:
  // Opens the pseudo-terminal (its size this terminal's, when there is one). `forward_input`
  // (-i) relays this process's stdin to it; without it the payload's input stays empty. Throws
  // Error.
  explicit PayloadTerminal(bool forward_input);
  ~PayloadTerminal();  // stops the relay and puts this terminal back
  PayloadTerminal(const PayloadTerminal&) = delete;
  PayloadTerminal& operator=(const PayloadTerminal&) = delete;

  // The payload's stdin, stdout and stderr: the terminal's other end, three times.
  std::array<int, 3> payload_stdio() const { return {replica_, replica_, replica_}; }

  // Starts relaying (call once the run is about to start); finish() waits until the payload's
  // side is closed everywhere (the run is over) and what it wrote is out.
  void start();
  void finish();

 private:
  void relay();

  int primary_ = -1, replica_ = -1;
  int wake_[2] = {-1, -1};  // finish() and SIGWINCH write here
  bool forward_input_;
  bool raw_ = false;
  termios saved_{};
  std::thread relay_;
};

}  // namespace rlm::cli
