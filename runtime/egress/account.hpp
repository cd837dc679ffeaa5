// The network account of one sandbox (rlm_sandbox/result.hpp, NetworkAccount), kept while its
// connections come and go. Everything in it comes from the sandbox, so it is capped: at most
// kMaxAllowed connections and kMaxDenied distinct denials are kept (a denial repeated is counted
// on its first entry; past the cap, each kind not seen yet still gets one), and `truncated` says
// when more happened. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

#include "rlm_sandbox/result.hpp"

namespace rlm::egress {

enum class Denial {
  dns,
  no_rule,
  sni_mismatch,
  host_mismatch,
  ech,
  private_address,
  not_tls,
  protocol,
  limit,
  upstream
};
const char* to_string(Denial denial);

class Account {
 public:
  static constexpr std::size_t kMaxAllowed = 1024, kMaxDenied = 256;
  static constexpr std::size_t kMaxNameBytes = 255;

  Account() : started_(std::chrono::steady_clock::now()) {}

  void deny(Denial kind, std::string name, std::string destination, std::uint16_t port);
  // A connection let through; the returned index goes to finish() when it ends (-1: not kept).
  long allow(std::string name, std::string address, std::uint16_t port, std::string rule);
  void finish(long index, std::uint64_t bytes_out, std::uint64_t bytes_in);
  void dns_answered();
  void dns_refused();
  // Times from now on (a sandbox built ahead: its run starts later). Only before anything is kept.
  void restart_clock();

  NetworkAccount snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point started_;
  std::vector<std::chrono::steady_clock::time_point> opened_;  // allowed[i]'s start
  NetworkAccount account_;
};

}  // namespace rlm::egress
