// The test world of the egress tests: this test process moves into a network namespace of its
// own (root only: ctest runs each test case as a process of its own), where loopback carries the
// fake internet's addresses and tests/egress/fake_world.py serves DNS and upstreams on them; the
// runtime's resolver is pointed at it (RLM_SANDBOX_RESOLVER). Sandboxes made from here nest
// inside that namespace, so nothing of this touches the host's network, and no test needs the
// internet. The world ends with the process (its namespace) and its fake servers with the fixture.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {

class EgressWorld {
 public:
  static constexpr const char* kTls = "203.0.113.10";
  static constexpr const char* kHttp = "203.0.113.11";
  static constexpr const char* kEcho = "203.0.113.12";
  static constexpr const char* kSink = "203.0.113.13";
  static constexpr int kResolverPort = 5353;

  // Whether this process may make the world: root, to give itself a network namespace.
  static bool possible() { return geteuid() == 0; }

  // Empty when the world is up; otherwise what failed.
  std::string start() {
    if (unshare(CLONE_NEWNET) != 0) return std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
    for (const char* address : {kTls, kHttp, kEcho, kSink})
      if (auto why = ip({"addr", "add", std::string(address) + "/32", "dev", "lo"}); !why.empty())
        return why;
    if (auto why = ip({"link", "set", "lo", "up"}); !why.empty()) return why;
    chmod(dir_.path().c_str(), 0755);
    const auto certificate = run_process(
        {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", dir_.file("server.key"), "-out",
         dir_.file("server.pem"), "-days", "2", "-subj", "/CN=pypi.test", "-addext",
         "subjectAltName=DNS:pypi.test,DNS:*.cdn.test,DNS:other.test,DNS:api.test"});
    if (certificate.exit_code != 0) return "openssl req: " + certificate.err;
    chmod(dir_.file("server.key").c_str(), 0644);
    return start_servers();
  }

  ~EgressWorld() {
    if (to_world_ >= 0) close(to_world_);  // the world reads its stdin to EOF, then exits
    unsetenv("RLM_SANDBOX_RESOLVER");
    unsetenv("RLM_SANDBOX_UPSTREAM_CA");
  }

  // The names the fake resolver answers, and with what.
  std::vector<std::string> answers = {"pypi.test=203.0.113.10",    "other.test=203.0.113.10",
                                      "a.cdn.test=203.0.113.10",   "api.test=203.0.113.10",
                                      "b.a.cdn.test=203.0.113.10", "web.test=203.0.113.11",
                                      "echo.test=203.0.113.12",    "sink.test=203.0.113.13",
                                      "rebind.test=127.0.0.1",     "meta.test=169.254.169.254"};

  // Every query the fake resolver got, "name type" each.
  std::vector<std::string> queries() const { return lines("queries.log"); }
  std::vector<std::string> requests() const { return lines("requests.log"); }
  bool queried(const std::string& name) const {
    for (const auto& line : queries())
      if (line.rfind(name + " ", 0) == 0) return true;
    return false;
  }

  const TempDir& dir() const { return dir_; }

  // `policy` with the world's directory bound read-only at /world (its CA is /world/server.pem).
  void bind_into(Policy& policy) const {
    Mount mount;
    mount.source = dir_.path();
    mount.target = "/world";
    mount.type = Mount::Type::bind;
    mount.readonly = true;
    policy.filesystem.mounts.push_back(mount);
  }

 private:
  static std::string ip(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "/usr/sbin/ip");
    const auto outcome = run_process(arguments);
    if (outcome.exit_code != 0) return "ip " + arguments[1] + ": " + outcome.err;
    return "";
  }

  std::string start_servers() {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return "pipe";
    std::vector<std::string> argv = {"/usr/bin/python3", source_path("tests/egress/fake_world.py"),
                                     dir_.path(), std::to_string(kResolverPort)};
    argv.insert(argv.end(), answers.begin(), answers.end());
    world_.pid = fork();
    if (world_.pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::vector<char*> args;
      for (auto& arg : argv) args.push_back(arg.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_world_ = in[1];
    world_.from = out[0];
    std::string seen;
    if (!read_until(world_.from, seen, "ready", std::chrono::seconds(60)))
      return "the fake world did not start: " + seen;
    setenv("RLM_SANDBOX_RESOLVER", ("127.0.0.1:" + std::to_string(kResolverPort)).c_str(), 1);
    // Injected credentials go only to an upstream verified against this (the host's CA store
    // knows nothing of the fake world).
    setenv("RLM_SANDBOX_UPSTREAM_CA", dir_.file("server.pem").c_str(), 1);
    return "";
  }

  std::vector<std::string> lines(const std::string& name) const {
    std::ifstream file(dir_.file(name));
    std::vector<std::string> all;
    for (std::string line; std::getline(file, line);) all.push_back(line);
    return all;
  }

  TempDir dir_;
  ChildWithPipe world_;
  int to_world_ = -1;
};

}  // namespace rlm::test
