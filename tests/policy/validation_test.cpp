// Validation of policy documents: every problem reported at once, at its JSON path, with a message
// that says what was expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "policy_test_helpers.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm {
namespace {

using test::only_problem_in;
using test::problems_in;
using ::testing::HasSubstr;

std::vector<std::string> paths_of(const std::vector<Diagnostic>& diagnostics) {
  std::vector<std::string> paths;
  for (const auto& d : diagnostics) paths.push_back(d.path);
  return paths;
}

TEST(PolicyValidation, EmptyObjectGivesTheDefaults) {
  const Policy policy = load_policy_text("{}", "empty.json");
  const Policy defaults;
  EXPECT_EQ(policy.name, "empty.json");
  EXPECT_EQ(policy.limits.memory_bytes, defaults.limits.memory_bytes);
  EXPECT_EQ(policy.limits.wall_time, defaults.limits.wall_time);
  EXPECT_EQ(policy.backend.prefer, defaults.backend.prefer);
  EXPECT_TRUE(policy.filesystem.mounts.empty());
  EXPECT_EQ(policy.hostname, "sandbox");
}

TEST(PolicyValidation, ReadsEveryField) {
  const Policy policy = load_policy_text(R"({
    "description": "everything",
    "backend": {"prefer": ["docker", "local"], "allow_unisolated": true},
    "limits": {"wall_time_ms": "2m", "cpu_time_ms": 1500, "kill_grace_ms": 0,
               "memory_bytes": "1.5G", "output_bytes": 4096, "file_size_bytes": "1M",
               "tmpfs_bytes": "8M", "pids": 5, "open_files": 3, "session_buffer_bytes": "2M"},
    "namespaces": {"user": false, "pid": false, "net": false, "mount": false, "ipc": false,
                   "uts": false, "cgroup": false},
    "filesystem": {"mounts": [{"source": "/srv/data", "target": "/data", "optional": true},
                              {"target": "/scratch", "type": "tmpfs", "size": "1M", "readonly": true}],
                   "workdir": "/data"},
    "network": "host",
    "seccomp": {"defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW",
                              "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_LE"}],
                              "comment": "stdio"}]},
    "capabilities": ["NET_BIND_SERVICE"],
    "env": {"clear": false, "set": {"A": "1"}, "pass": ["TERM"]},
    "user": {"uid": 0, "gid": 4294967294},
    "hostname": "box-1.local",
    "docker": {"image": "debian:12"}
  })",
                                         "all.json");
  EXPECT_EQ(policy.description, "everything");
  EXPECT_EQ(policy.backend.prefer, (std::vector<std::string>{"docker", "local"}));
  EXPECT_TRUE(policy.backend.allow_unisolated);
  EXPECT_EQ(policy.limits.wall_time, std::chrono::minutes(2));
  EXPECT_EQ(policy.limits.cpu_time, std::chrono::milliseconds(1500));
  EXPECT_EQ(policy.limits.kill_grace, std::chrono::milliseconds(0));
  EXPECT_EQ(policy.limits.memory_bytes, 1610612736u);
  EXPECT_EQ(policy.limits.output_bytes, 4096u);
  EXPECT_EQ(policy.limits.pids, 5u);
  EXPECT_EQ(policy.limits.open_files, 3u);
  EXPECT_EQ(policy.limits.session_buffer_bytes, 2u << 20);
  EXPECT_FALSE(policy.namespaces.user);
  EXPECT_FALSE(policy.namespaces.cgroup);
  ASSERT_EQ(policy.filesystem.mounts.size(), 2u);
  const Mount& bind = policy.filesystem.mounts[0];
  EXPECT_EQ(bind.type, Mount::Type::bind);
  EXPECT_EQ(bind.source, "/srv/data");
  EXPECT_TRUE(bind.readonly) << "binds default to read-only";
  EXPECT_TRUE(bind.optional);
  const Mount& tmpfs = policy.filesystem.mounts[1];
  EXPECT_EQ(tmpfs.type, Mount::Type::tmpfs);
  EXPECT_TRUE(tmpfs.readonly);
  EXPECT_EQ(tmpfs.size_bytes, 1u << 20);
  EXPECT_EQ(policy.filesystem.workdir, "/data");
  EXPECT_EQ(policy.network, Network::host);
  EXPECT_EQ(policy.seccomp.default_action, "SCMP_ACT_ERRNO");
  ASSERT_EQ(policy.seccomp.syscalls.size(), 1u);
  EXPECT_EQ(policy.seccomp.syscalls[0].names, (std::vector<std::string>{"read", "write"}));
  ASSERT_EQ(policy.seccomp.syscalls[0].args.size(), 1u);
  EXPECT_EQ(policy.seccomp.syscalls[0].args[0].op, "SCMP_CMP_LE");
  EXPECT_EQ(policy.seccomp.syscalls[0].args[0].value, 1u);
  EXPECT_EQ(policy.capabilities, (std::vector<std::string>{"CAP_NET_BIND_SERVICE"}));
  EXPECT_FALSE(policy.env.clear);
  EXPECT_EQ(policy.env.set.at("A"), "1");
  EXPECT_EQ(policy.env.pass, (std::vector<std::string>{"TERM"}));
  EXPECT_EQ(policy.user.uid, 0u);
  EXPECT_EQ(policy.user.gid, 4294967294u);
  EXPECT_EQ(policy.hostname, "box-1.local");
  EXPECT_EQ(policy.docker.image, "debian:12");
}

TEST(PolicyValidation, TmpfsDefaultsToWritable) {
  const Policy policy =
      load_policy_text(R"({"filesystem": {"mounts": [{"target": "/t", "type": "tmpfs"}]}})", "t");
  ASSERT_EQ(policy.filesystem.mounts.size(), 1u);
  EXPECT_FALSE(policy.filesystem.mounts[0].readonly);
  EXPECT_FALSE(policy.filesystem.mounts[0].size_bytes.has_value());
}

TEST(PolicyValidation, ReportsEveryMistakeAtOnceWithPaths) {
  const auto found = problems_in(R"({
    "limits": {"memory_bytes": "lots"},
    "filesystem": {"mounts": [{"source": "/a", "target": "/a"}, {"source": "/b", "target": "/b"},
                              {"source": "/c", "target": "relative"}]},
    "seccomp": {"syscalls": [{"names": ["read", "no_such_call"], "action": "SCMP_ACT_ERRNO"}]}
  })");
  EXPECT_EQ(paths_of(found),
            (std::vector<std::string>{"limits.memory_bytes", "filesystem.mounts[2].target",
                                      "seccomp.syscalls[0].names[1]"}));
}

TEST(PolicyValidation, PolicyErrorCarriesAllDiagnosticsAndTheOrigin) {
  try {
    load_policy_text(R"({"pids": 1, "hostname": "", "network": "all"})", "three.json");
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& error) {
    EXPECT_EQ(error.origin(), "three.json");
    EXPECT_EQ(error.diagnostics().size(), 3u);
    EXPECT_THAT(error.what(), HasSubstr("policy three.json: 3 errors"));
    EXPECT_THAT(error.what(), HasSubstr("\n  hostname: "));
  }
}

TEST(PolicyValidation, UnknownKeysSuggestTheClosestKey) {
  auto d = only_problem_in(R"({"limits": {"memroy_bytes": "1G"}})");
  EXPECT_EQ(d.to_string(), "limits.memroy_bytes: unknown key; did you mean memory_bytes?");
  d = only_problem_in(R"({"netwrok": "none"})");
  EXPECT_EQ(d.to_string(), "netwrok: unknown key; did you mean network?");
  d = only_problem_in(
      R"({"filesystem": {"mounts": [{"target": "/x", "type": "tmpfs", "sise": 1}]}})");
  EXPECT_EQ(d.to_string(), "filesystem.mounts[0].sise: unknown key; did you mean size?");
  d = only_problem_in(R"({"seccomp": {"default_action": "SCMP_ACT_ALLOW"}})");
  EXPECT_EQ(d.to_string(), "seccomp.default_action: unknown key; did you mean defaultAction?");
}

TEST(PolicyValidation, TopLevelKeyThatBelongsInASectionNamesTheSection) {
  EXPECT_EQ(only_problem_in(R"({"memory_bytes": "1G"})").message,
            "unknown key; did you mean limits.memory_bytes?");
  EXPECT_EQ(only_problem_in(R"({"workdir": "/tmp"})").message,
            "unknown key; did you mean filesystem.workdir?");
}

TEST(PolicyValidation, UnknownKeyWithNothingCloseListsTheKeys) {
  const auto d = only_problem_in(R"({"user": {"name": "bob"}})");
  EXPECT_EQ(d.path, "user.name");
  EXPECT_EQ(d.message, "unknown key; expected one of: uid, gid");
}

TEST(PolicyValidation, WrongTypesSayWhatWasExpectedAndGiven) {
  EXPECT_EQ(only_problem_in(R"({"namespaces": {"pid": "yes"}})").to_string(),
            "namespaces.pid: expected true or false, got a string (\"yes\")");
  EXPECT_EQ(only_problem_in(R"({"limits": []})").to_string(),
            "limits: expected an object, got an array");
  EXPECT_EQ(only_problem_in(R"({"limits": {"pids": "64"}})").to_string(),
            "limits.pids: expected an integer, got a string (\"64\")");
  EXPECT_EQ(only_problem_in(R"({"capabilities": "CAP_CHOWN"})").to_string(),
            "capabilities: expected an array, got a string (\"CAP_CHOWN\")");
  EXPECT_EQ(only_problem_in(R"({"limits": {"memory_bytes": true}})").path, "limits.memory_bytes");
  EXPECT_THAT(only_problem_in(R"({"limits": {"memory_bytes": 1.5}})").message,
              HasSubstr("expected a whole number of bytes"));
  EXPECT_THAT(only_problem_in(R"({"limits": {"wall_time_ms": "soon"}})").message,
              HasSubstr("expected a duration"));
}

TEST(PolicyValidation, RootMustBeAnObject) {
  const auto d = only_problem_in("[1, 2]");
  EXPECT_EQ(d.path, "");
  EXPECT_EQ(d.message, "a policy must be a JSON object, got an array");
}

TEST(PolicyValidation, MalformedJsonGivesLineAndColumn) {
  const auto d = only_problem_in("{\n  \"limits\": {\n    \"pids\": 4,}\n}");
  EXPECT_EQ(d.path, "");
  EXPECT_EQ(d.message,
            "malformed JSON at line 3, column 15: unexpected '}'; expected string literal");
}

TEST(PolicyValidation, MalformedJsonAtTheEnd) {
  const auto d = only_problem_in("{\"hostname\": \"x\"");
  EXPECT_THAT(d.message, HasSubstr("malformed JSON at line 1, column 17"));
  EXPECT_THAT(d.message, HasSubstr("unexpected end of input"));
  EXPECT_THAT(d.message, ::testing::Not(HasSubstr("json.exception")));
}

TEST(PolicyValidation, HostileDocumentsAreRejectedCleanly) {
  EXPECT_EQ(only_problem_in(std::string(100'000, '[') + std::string(100'000, ']')).message,
            "malformed JSON: nested more than 64 levels deep");
  EXPECT_THAT(only_problem_in(R"({"limits": {"pids": 1e400}})").message,
              HasSubstr("malformed JSON: number overflow"));
  EXPECT_THAT(only_problem_in("").message, HasSubstr("malformed JSON at line 1, column 1"));
  // A huge container given where a scalar belongs is named, not printed.
  EXPECT_EQ(only_problem_in(R"({"hostname": [)" + std::string(60, '[') + std::string(61, ']') + "}")
                .message,
            "expected a string, got an array");
}

TEST(PolicyValidation, DuplicateKeysAreReportedWithTheirPath) {
  const auto found = problems_in(R"({"network": "none", "filesystem": {"mounts": [
      {"target": "/t", "type": "tmpfs", "type": "tmpfs"}]}, "network": "none"})");
  EXPECT_EQ(paths_of(found), (std::vector<std::string>{"filesystem.mounts[0].type", "network"}));
  EXPECT_THAT(found.at(0).message, HasSubstr("duplicate key"));
}

TEST(PolicyValidation, Ranges) {
  EXPECT_THAT(only_problem_in(R"({"limits": {"wall_time_ms": 0}})").message,
              HasSubstr("must be between 1ms and 168h"));
  EXPECT_THAT(only_problem_in(R"({"limits": {"cpu_time_ms": "-1s"}})").message,
              HasSubstr("expected a duration"));
  EXPECT_THAT(only_problem_in(R"({"limits": {"wall_time_ms": -5}})").message,
              HasSubstr("must be between"));
  EXPECT_THAT(only_problem_in(R"({"limits": {"kill_grace_ms": "61s"}})").message,
              HasSubstr("must be between 0ms and 1m"));
  EXPECT_EQ(only_problem_in(R"({"limits": {"memory_bytes": 0}})").path, "limits.memory_bytes");
  EXPECT_EQ(only_problem_in(R"({"limits": {"tmpfs_bytes": "0M"}})").path, "limits.tmpfs_bytes");
  EXPECT_EQ(only_problem_in(R"({"limits": {"session_buffer_bytes": 0}})").path,
            "limits.session_buffer_bytes");
  EXPECT_EQ(only_problem_in(R"({"limits": {"output_bytes": -1}})").path, "limits.output_bytes");
  EXPECT_THAT(only_problem_in(R"({"limits": {"memory_bytes": 1e30}})").message,
              HasSubstr("too large"));
  EXPECT_EQ(only_problem_in(R"({"limits": {"pids": 0}})").message,
            "must be between 1 and 4294967295, got 0");
  EXPECT_EQ(only_problem_in(R"({"limits": {"open_files": 2}})").message,
            "must be between 3 and 4294967295, got 2");
  EXPECT_EQ(only_problem_in(R"({"user": {"uid": 4294967295}})").path, "user.uid");
  EXPECT_EQ(only_problem_in(R"({"user": {"gid": -1}})").path, "user.gid");
}

// limits.cpus: a number of CPUs (fractions allowed), null for none; shown and reloaded unchanged.
TEST(PolicyValidation, CpusIsABandwidthInCpus) {
  EXPECT_FALSE(load_policy_text("{}", "empty.json").limits.cpus.has_value());
  EXPECT_EQ(load_policy_text(R"({"limits": {"cpus": 0.5}})", "a.json").limits.cpus, 0.5);
  EXPECT_EQ(load_policy_text(R"({"limits": {"cpus": 2}})", "a.json").limits.cpus, 2.0);
  EXPECT_FALSE(load_policy_text(R"({"limits": {"cpus": null}})", "a.json").limits.cpus);
  EXPECT_EQ(only_problem_in(R"({"limits": {"cpus": 0}})").message,
            "must be between 0.01 and 1024, got 0");
  EXPECT_EQ(only_problem_in(R"({"limits": {"cpus": 2000}})").path, "limits.cpus");
  EXPECT_EQ(only_problem_in(R"({"limits": {"cpus": -1}})").path, "limits.cpus");
  EXPECT_THAT(only_problem_in(R"({"limits": {"cpus": "2"}})").message, HasSubstr("a number"));
  for (const char* text : {R"({"limits": {"cpus": 1.5}})", "{}"}) {
    const Policy policy = load_policy_text(text, "a.json");
    EXPECT_EQ(policy_from_json(policy.to_json(), "again").to_json(), policy.to_json()) << text;
  }
  EXPECT_EQ(load_policy_text("{}", "a.json").to_json()["limits"]["cpus"], nullptr);
}

TEST(PolicyValidation, Hostname) {
  EXPECT_EQ(only_problem_in(R"({"hostname": ""})").path, "hostname");
  EXPECT_EQ(only_problem_in(R"({"hostname": "has space"})").path, "hostname");
  EXPECT_EQ(only_problem_in(R"({"hostname": "under_score"})").path, "hostname");
  EXPECT_EQ(only_problem_in(R"({"hostname": ")" + std::string(65, 'a') + "\"}").path, "hostname");
  EXPECT_TRUE(problems_in(R"({"hostname": ")" + std::string(64, 'a') + "\"}").empty());
}

TEST(PolicyValidation, MountTargets) {
  const auto message_for = [](const std::string& target) {
    return only_problem_in(R"({"filesystem": {"mounts": [{"type": "tmpfs", "target": ")" + target +
                           "\"}]}}")
        .message;
  };
  EXPECT_THAT(message_for("tmp"), HasSubstr("must be an absolute path"));
  EXPECT_THAT(message_for("/"), HasSubstr("must not be \"/\""));
  EXPECT_THAT(message_for("/a/../etc"), HasSubstr("'..'"));
  EXPECT_THAT(message_for("/a//b"), HasSubstr("normal form: \"/a/b\""));
  EXPECT_THAT(message_for("/a/./b"), HasSubstr("normal form: \"/a/b\""));
  EXPECT_THAT(message_for("/a/"), HasSubstr("normal form: \"/a\""));
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"type": "tmpfs"}]}})").path,
            "filesystem.mounts[0].target");
}

TEST(PolicyValidation, MountTypeRules) {
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x"}]}})").to_string(),
            "filesystem.mounts[0].source: missing; a bind mount needs the absolute host path to "
            "bind (or set \"type\": \"tmpfs\")");
  EXPECT_EQ(
      only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "source": "x"}]}})").path,
      "filesystem.mounts[0].source");
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "type": "tmpfs",
            "source": "/y"}]}})")
                .to_string(),
            "filesystem.mounts[0].source: a tmpfs mount takes no source");
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "source": "/x",
            "size": "1M"}]}})")
                .to_string(),
            "filesystem.mounts[0].size: only a tmpfs mount takes a size");
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "type": "tmpfs",
            "optional": true}]}})")
                .to_string(),
            "filesystem.mounts[0].optional: only a bind mount can be optional");
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "type": "overlay"}]}})")
                .to_string(),
            "filesystem.mounts[0].type: unknown value \"overlay\"; expected one of: bind tmpfs");
}

TEST(PolicyValidation, MountDuplicatesAndHiddenMounts) {
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"mounts": [{"target": "/x", "type": "tmpfs"},
            {"target": "/x", "source": "/x"}]}})")
                .to_string(),
            "filesystem.mounts[1].target: duplicates filesystem.mounts[0].target (/x)");
  const auto hidden = only_problem_in(R"({"filesystem": {"mounts": [
      {"target": "/usr/share", "type": "tmpfs"}, {"target": "/usr", "source": "/usr"}]}})");
  EXPECT_EQ(hidden.path, "filesystem.mounts[0].target");
  EXPECT_THAT(hidden.message, HasSubstr("would hide it"));
  EXPECT_TRUE(problems_in(R"({"filesystem": {"mounts": [{"target": "/usr", "source": "/usr"},
      {"target": "/usr/share", "type": "tmpfs"}, {"target": "/usrx", "type": "tmpfs"}]}})")
                  .empty());
}

TEST(PolicyValidation, Workdir) {
  EXPECT_TRUE(problems_in(R"({"filesystem": {"workdir": ""}})").empty());
  EXPECT_TRUE(problems_in(R"({"filesystem": {"workdir": "/"}})").empty());
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"workdir": "work"}})").path, "filesystem.workdir");
}

TEST(PolicyValidation, PathsMayNotContainNul) {
  EXPECT_EQ(only_problem_in(R"({"filesystem": {"workdir": "/tmp\u0000/x"}})").message,
            "must not contain a NUL character");
}

TEST(PolicyValidation, Environment) {
  EXPECT_EQ(only_problem_in(R"({"env": {"set": {"A=B": "x"}}})").path, "env.set[\"A=B\"]");
  EXPECT_EQ(only_problem_in(R"({"env": {"set": {"": "x"}}})").path, "env.set[\"\"]");
  EXPECT_EQ(only_problem_in(R"({"env": {"set": {"A": 1}}})").to_string(),
            "env.set.A: expected a string, got a number (1)");
  EXPECT_EQ(only_problem_in(R"({"env": {"pass": ["HOME", "A=B"]}})").path, "env.pass[1]");
  EXPECT_EQ(only_problem_in(R"({"env": {"pass": ["HOME", "HOME"]}})").to_string(),
            "env.pass[1]: duplicates env.pass[0] (HOME)");
}

TEST(PolicyValidation, BackendPreference) {
  EXPECT_EQ(only_problem_in(R"({"backend": {"prefer": ["namespaec"]}})").to_string(),
            "backend.prefer[0]: unknown value \"namespaec\"; did you mean namespace?");
  EXPECT_EQ(only_problem_in(R"({"backend": {"prefer": []}})").to_string(),
            "backend.prefer: must name at least one backend");
  EXPECT_EQ(only_problem_in(R"({"backend": {"prefer": ["docker", "docker"]}})").to_string(),
            "backend.prefer[1]: duplicates backend.prefer[0] (docker)");
  const auto unusable = only_problem_in(R"({"backend": {"prefer": ["namespace", "local"]}})");
  EXPECT_EQ(unusable.path, "backend.prefer[1]");
  EXPECT_THAT(unusable.message, HasSubstr("allow_unisolated"));
}

TEST(PolicyValidation, NetworkAndNetNamespaceMustAgree) {
  EXPECT_EQ(only_problem_in(R"({"network": "internet"})").to_string(),
            "network: unknown value \"internet\"; expected one of: none host");
  EXPECT_EQ(only_problem_in(R"({"namespaces": {"net": false}})").path, "namespaces.net");
  EXPECT_EQ(only_problem_in(R"({"network": "host"})").path, "namespaces.net");
  EXPECT_TRUE(problems_in(R"({"network": "host", "namespaces": {"net": false}})").empty());
}

TEST(PolicyValidation, SeccompUnknownSyscallSuggestsOne) {
  const auto d = only_problem_in(
      R"({"seccomp": {"syscalls": [{"names": ["ptrce"], "action": "SCMP_ACT_ERRNO"}]}})");
  EXPECT_EQ(d.path, "seccomp.syscalls[0].names[0]");
  EXPECT_EQ(d.message,
            "unknown syscall \"ptrce\" (libseccomp does not know it); did you mean ptrace?");
}

TEST(PolicyValidation, SeccompAcceptsOtherArchitecturesSyscalls) {
  // Docker profiles list syscalls of several architectures; libseccomp knows them all.
  EXPECT_TRUE(problems_in(R"({"seccomp": {"syscalls": [{"names": ["socketcall", "ptrace"],
      "action": "SCMP_ACT_ERRNO"}]}})")
                  .empty());
}

TEST(PolicyValidation, SeccompRuleShape) {
  const auto rule = [](const std::string& body) {
    return R"({"seccomp": {"syscalls": [)" + body + "]}}";
  };
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["ptrace"]})")).path, "seccomp.syscalls[0].action");
  EXPECT_EQ(only_problem_in(rule(R"({"action": "SCMP_ACT_KILL"})")).path,
            "seccomp.syscalls[0].names");
  EXPECT_EQ(only_problem_in(rule(R"({"names": [], "action": "SCMP_ACT_KILL"})")).to_string(),
            "seccomp.syscalls[0].names: must list at least one syscall");
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["ptrace"], "action": "SCMP_ACT_NOTIFY"})")).path,
            "seccomp.syscalls[0].action");
  EXPECT_EQ(
      only_problem_in(rule(R"({"names": ["ptrace"], "action": "SCMP_ACT_KILL", "errnoRet": 1})"))
          .to_string(),
      "seccomp.syscalls[0].errnoRet: only a rule with action SCMP_ACT_ERRNO takes errnoRet");
  EXPECT_EQ(only_problem_in(
                rule(R"({"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 4096})"))
                .path,
            "seccomp.syscalls[0].errnoRet");
  EXPECT_EQ(
      only_problem_in(rule(R"({"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 0})"))
          .path,
      "seccomp.syscalls[0].errnoRet");
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
      "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]})"))
                .path,
            "seccomp.syscalls[0].args[0].index");
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
      "args": [{"index": 1, "value": 1, "op": "SCMP_CMP_EQUAL"}]})"))
                .to_string(),
            "seccomp.syscalls[0].args[0].op: unknown value \"SCMP_CMP_EQUAL\"; did you mean "
            "SCMP_CMP_EQ?");
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
      "args": [{"index": 1, "op": "SCMP_CMP_EQ"}]})"))
                .path,
            "seccomp.syscalls[0].args[0].value");
  EXPECT_EQ(only_problem_in(rule(R"({"names": ["read", "read"], "action": "SCMP_ACT_ERRNO"})"))
                .to_string(),
            "seccomp.syscalls[0].names[1]: duplicates seccomp.syscalls[0].names[0] (read)");
}

TEST(PolicyValidation, SeccompRuleMayRepeatTheDefaultAction) {
  // A no-op rule is dropped by the seccomp compiler, not rejected: a policy may change the
  // default of a base whose rules then coincide with it.
  EXPECT_TRUE(problems_in(R"({"seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
      {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}})")
                  .empty());
}

TEST(PolicyValidation, CapabilitiesAreCanonicalized) {
  const Policy policy = load_policy_text(
      R"({"capabilities": ["NET_ADMIN", "cap_chown", "CAP_SYS_PTRACE", "Kill"]})", "caps");
  EXPECT_EQ(policy.capabilities,
            (std::vector<std::string>{"CAP_NET_ADMIN", "CAP_CHOWN", "CAP_SYS_PTRACE", "CAP_KILL"}));
}

TEST(PolicyValidation, CapabilityMistakes) {
  EXPECT_EQ(only_problem_in(R"({"capabilities": ["CAP_NET_ADMN"]})").to_string(),
            "capabilities[0]: unknown capability \"CAP_NET_ADMN\"; did you mean CAP_NET_ADMIN?");
  EXPECT_EQ(only_problem_in(R"({"capabilities": ["12"]})").path, "capabilities[0]");
  EXPECT_EQ(only_problem_in(R"({"capabilities": ["NET_ADMIN", "cap_net_admin"]})").to_string(),
            "capabilities[1]: duplicates capabilities[0] (CAP_NET_ADMIN)");
}

TEST(PolicyValidation, PolicyFromJsonRejectsUnresolvedExtends) {
  try {
    policy_from_json(nlohmann::json{{"extends", "default"}}, "doc");
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& error) {
    ASSERT_EQ(error.diagnostics().size(), 1u);
    EXPECT_EQ(error.diagnostics()[0].path, "extends");
  }
}

TEST(PolicyValidation, DocumentedExampleIsValid) {
  // The example in /work/shared/DESIGN.md section 3 and docs/policy.md.
  EXPECT_TRUE(problems_in(R"({
    "extends": "default",
    "backend": {"prefer": ["namespace", "docker"], "allow_unisolated": false},
    "limits": {"wall_time_ms": 10000, "cpu_time_ms": 10000, "memory_bytes": "256M",
               "pids": 64, "output_bytes": "1M", "file_size_bytes": "16M", "open_files": 256,
               "tmpfs_bytes": "64M"},
    "namespaces": {"user": true, "pid": true, "net": true, "mount": true, "ipc": true,
                   "uts": true, "cgroup": true},
    "filesystem": {"mounts": [{"source": "/usr", "target": "/usr", "type": "bind", "readonly": true},
                              {"target": "/tmp", "type": "tmpfs"}],
                   "workdir": "/work"},
    "network": "none",
    "seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["ptrace", "bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]},
    "capabilities": [],
    "env": {"clear": true, "set": {"PATH": "/usr/bin:/bin"}, "pass": ["LANG"]},
    "user": {"uid": 1000, "gid": 1000},
    "hostname": "sandbox",
    "docker": {"image": "python:3.12-slim"}
  })")
                  .empty());
}

}  // namespace
}  // namespace rlm
