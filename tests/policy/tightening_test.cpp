// rlm::loosenings: what a server refuses in a client's policy. Every loosening is found at its
// JSON path; every tightening, and a policy equal to the one offered, passes. Bind sources are
// resolved on the real host filesystem (symlinks, "..", missing paths) in a temporary directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "support/subprocess.hpp"

namespace rlm {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> paths_of(const std::vector<Diagnostic>& found) {
  std::vector<std::string> paths;
  for (const auto& d : found) paths.push_back(d.path);
  return paths;
}

std::string listed(const std::vector<Diagnostic>& found) {
  std::string text;
  for (const auto& d : found) text += "\n  " + d.to_string();
  return text;
}

Mount bind_mount(std::string source, std::string target, bool readonly = true) {
  Mount mount;
  mount.source = std::move(source);
  mount.target = std::move(target);
  mount.readonly = readonly;
  return mount;
}

Mount tmpfs(std::string target, std::optional<std::uint64_t> size = std::nullopt) {
  Mount mount;
  mount.type = Mount::Type::tmpfs;
  mount.target = std::move(target);
  mount.readonly = false;
  mount.size_bytes = size;
  return mount;
}

SeccompRule rule(std::vector<std::string> names, std::string action) {
  SeccompRule result;
  result.names = std::move(names);
  result.action = std::move(action);
  return result;
}

class TighteningTest : public ::testing::Test {
 protected:
  // The one loosening of `candidate` against the default policy; fails unless there is one.
  Diagnostic only_loosening(const Policy& candidate,
                            const std::vector<PermittedBind>& permitted = {}) {
    const auto found = loosenings(base_, candidate, permitted);
    if (found.size() == 1) return found.front();
    ADD_FAILURE() << "expected exactly one loosening, got " << found.size() << listed(found);
    return {};
  }
  void expect_accepted(const Policy& candidate, const std::vector<PermittedBind>& permitted = {}) {
    const auto found = loosenings(base_, candidate, permitted);
    EXPECT_THAT(found, IsEmpty()) << listed(found);
  }

  Policy base_ = load_policy("default");
};

TEST_F(TighteningTest, EveryShippedPolicyEqualToItselfIsAccepted) {
  for (const auto& name : shipped_policy_names()) {
    const Policy policy = load_policy(name);
    const auto found = loosenings(policy, policy, {});
    EXPECT_THAT(found, IsEmpty()) << name << listed(found);
  }
}

// The server parses a client's overrides from JSON: the offered policy printed and read back is
// the same policy, not a loosening.
TEST_F(TighteningTest, PolicyRoundTrippedThroughJsonIsAccepted) {
  for (const auto& name : shipped_policy_names()) {
    const Policy policy = load_policy(name);
    const auto found = loosenings(policy, policy_from_json(policy.to_json(), "client"), {});
    EXPECT_THAT(found, IsEmpty()) << name << listed(found);
  }
}

TEST_F(TighteningTest, StrictTightensDefaultAndDefaultLoosensStrictEverywhere) {
  const Policy strict = load_policy("strict");
  EXPECT_THAT(loosenings(base_, strict, {}), IsEmpty()) << listed(loosenings(base_, strict, {}));
  const auto found = loosenings(strict, base_, {});
  EXPECT_THAT(paths_of(found),
              ElementsAre("backend.prefer[1]", "limits.wall_time_ms", "limits.cpu_time_ms",
                          "limits.memory_bytes", "limits.output_bytes", "limits.file_size_bytes",
                          "limits.tmpfs_bytes", "limits.pids", "limits.open_files",
                          "filesystem.mounts[9].size", "seccomp.syscalls"))
      << listed(found);
}

// ---- limits ------------------------------------------------------------------------------------

TEST_F(TighteningTest, RaisedMemoryLimitIsRefusedSayingBothValues) {
  Policy candidate = base_;
  candidate.limits.memory_bytes = 512ull << 20;
  const auto found = only_loosening(candidate);
  EXPECT_EQ(found.path, "limits.memory_bytes");
  EXPECT_EQ(found.message, "512M is above the offered policy's 256M");
}

TEST_F(TighteningTest, EachRaisedLimitIsRefusedAtItsPath) {
  const std::vector<std::pair<std::string, void (*)(Limits&)>> raises = {
      {"limits.wall_time_ms", [](Limits& l) { l.wall_time += 1ms; }},
      {"limits.cpu_time_ms", [](Limits& l) { l.cpu_time += 1ms; }},
      {"limits.kill_grace_ms", [](Limits& l) { l.kill_grace += 1ms; }},
      {"limits.memory_bytes", [](Limits& l) { l.memory_bytes += 1; }},
      {"limits.output_bytes", [](Limits& l) { l.output_bytes += 1; }},
      {"limits.file_size_bytes", [](Limits& l) { l.file_size_bytes += 1; }},
      {"limits.tmpfs_bytes", [](Limits& l) { l.tmpfs_bytes += 1; }},
      {"limits.session_buffer_bytes", [](Limits& l) { l.session_buffer_bytes += 1; }},
      {"limits.pids", [](Limits& l) { l.pids += 1; }},
      {"limits.open_files", [](Limits& l) { l.open_files += 1; }},
  };
  for (const auto& [path, raise] : raises) {
    Policy candidate = base_;
    raise(candidate.limits);
    const auto found = loosenings(base_, candidate, {});
    // A larger tmpfs_bytes also grows /tmp, whose size it is by default.
    if (path == "limits.tmpfs_bytes")
      EXPECT_THAT(paths_of(found), ElementsAre(path, "filesystem.mounts[9].size")) << listed(found);
    else
      EXPECT_THAT(paths_of(found), ElementsAre(path)) << listed(found);
  }
}

TEST_F(TighteningTest, EveryLimitLoweredIsAccepted) {
  Policy candidate = base_;
  Limits& l = candidate.limits;
  l.wall_time = 1s, l.cpu_time = 1s, l.kill_grace = 10ms, l.memory_bytes = 64 << 20;
  l.output_bytes = 4096, l.file_size_bytes = 4096, l.tmpfs_bytes = 1 << 20;
  l.session_buffer_bytes = 1 << 20, l.pids = 4, l.open_files = 16, l.cpus = 0.5;
  expect_accepted(candidate);
}

TEST_F(TighteningTest, CpuBandwidthMayOnlyShrink) {
  base_.limits.cpus = 1.0;
  Policy lifted = base_;
  lifted.limits.cpus.reset();
  EXPECT_EQ(only_loosening(lifted).path, "limits.cpus");
  EXPECT_THAT(only_loosening(lifted).message, HasSubstr("no CPU limit"));
  Policy raised = base_;
  raised.limits.cpus = 2.0;
  EXPECT_EQ(only_loosening(raised).message, "2 CPUs is above the offered policy's 1");
  Policy lowered = base_;
  lowered.limits.cpus = 0.25;
  expect_accepted(lowered);
  // An offered policy without a CPU limit accepts any.
  base_.limits.cpus.reset();
  expect_accepted(raised);
}

// ---- isolation switches ------------------------------------------------------------------------

TEST_F(TighteningTest, EachNamespaceTurnedOffIsRefused) {
  const std::pair<std::string, bool Namespaces::*> kinds[] = {
      {"user", &Namespaces::user},    {"pid", &Namespaces::pid}, {"net", &Namespaces::net},
      {"mount", &Namespaces::mount},  {"ipc", &Namespaces::ipc}, {"uts", &Namespaces::uts},
      {"cgroup", &Namespaces::cgroup}};
  for (const auto& [name, member] : kinds) {
    Policy candidate = base_;
    candidate.namespaces.*member = false;
    EXPECT_EQ(only_loosening(candidate).path, "namespaces." + name);
  }
}

TEST_F(TighteningTest, NamespaceTurnedOnIsAccepted) {
  base_.namespaces.net = false;
  Policy candidate = base_;
  candidate.namespaces.net = true;
  expect_accepted(candidate);
}

TEST_F(TighteningTest, HostNetworkIsRefusedUnlessOffered) {
  Policy candidate = base_;
  candidate.network = Network::host;
  const auto found = only_loosening(candidate);
  EXPECT_EQ(found.path, "network");
  EXPECT_THAT(found.message, HasSubstr("none"));
  base_.network = Network::host;
  expect_accepted(candidate);
  candidate.network = Network::none;
  expect_accepted(candidate);
}

TEST_F(TighteningTest, AddedCapabilityIsRefusedAndASubsetAccepted) {
  Policy candidate = base_;
  candidate.capabilities = {"CAP_NET_RAW"};
  EXPECT_EQ(only_loosening(candidate).path, "capabilities[0]");
  base_.capabilities = {"CAP_NET_RAW", "CAP_CHOWN"};
  candidate.capabilities = {"CAP_CHOWN"};
  expect_accepted(candidate);
}

TEST_F(TighteningTest, ChangedSandboxUserIsRefused) {
  Policy candidate = base_;
  candidate.user.uid = 0;
  candidate.user.gid = 0;
  EXPECT_THAT(paths_of(loosenings(base_, candidate, {})), ElementsAre("user.uid", "user.gid"));
}

TEST_F(TighteningTest, AnotherBackendOrUnisolatedRunsAreRefused) {
  Policy candidate = base_;
  candidate.backend.prefer = {"docker", "local"};
  EXPECT_EQ(only_loosening(candidate).path, "backend.prefer[1]");
  candidate = base_;
  candidate.backend.allow_unisolated = true;
  EXPECT_EQ(only_loosening(candidate).path, "backend.allow_unisolated");
  candidate = base_;
  candidate.backend.prefer = {"docker", "namespace"};  // reordered
  expect_accepted(candidate);
  candidate.backend.prefer = {"namespace"};
  expect_accepted(candidate);
}

TEST_F(TighteningTest, ChangedDockerImageIsRefused) {
  Policy candidate = base_;
  candidate.docker.image = "attacker/image:latest";
  EXPECT_EQ(only_loosening(candidate).path, "docker.image");
}

TEST_F(TighteningTest, KernelInterfaceBindsTurnedOnAreRefused) {
  Policy candidate = base_;
  candidate.filesystem.allow_kernel_interface_binds = true;
  EXPECT_EQ(only_loosening(candidate).path, "filesystem.allow_kernel_interface_binds");
}

TEST_F(TighteningTest, ServerEnvironmentIsNotHandedOut) {
  Policy candidate = base_;
  candidate.env.clear = false;
  EXPECT_EQ(only_loosening(candidate).path, "env.clear");
  candidate = base_;
  candidate.env.pass = {"HOME"};
  EXPECT_EQ(only_loosening(candidate).path, "env.pass[0]");
}

TEST_F(TighteningTest, ClientOwnFieldsAreFree) {
  Policy candidate = base_;
  candidate.name = "mine";
  candidate.description = "a client's policy";
  candidate.env.set = {{"PATH", "/bin"}, {"FOO", "bar"}};
  candidate.filesystem.workdir = "/usr";
  candidate.hostname = "elsewhere";
  expect_accepted(candidate);
}

// ---- seccomp -----------------------------------------------------------------------------------

TEST_F(TighteningTest, SeccompRulesThatOnlyRefuseMayBeAdded) {
  base_.seccomp.syscalls = {rule({"ptrace"}, "SCMP_ACT_ERRNO")};
  Policy candidate = base_;
  candidate.seccomp.syscalls.insert(candidate.seccomp.syscalls.begin(),
                                    rule({"chmod"}, "SCMP_ACT_KILL_PROCESS"));
  candidate.seccomp.syscalls.push_back(rule({"uname"}, "SCMP_ACT_ERRNO"));
  candidate.seccomp.syscalls.push_back(rule({"getpid"}, "SCMP_ACT_TRAP"));
  expect_accepted(candidate);
  candidate.seccomp.default_action = "SCMP_ACT_KILL";
  expect_accepted(candidate);
}

TEST_F(TighteningTest, SeccompRuleThatAllowsIsRefused) {
  for (const char* action : {"SCMP_ACT_ALLOW", "SCMP_ACT_LOG"}) {
    Policy candidate = base_;
    candidate.seccomp.syscalls.push_back(rule({"ptrace"}, action));
    const auto found = only_loosening(candidate);
    EXPECT_EQ(found.path, "seccomp.syscalls[0].action");
    EXPECT_THAT(found.message, HasSubstr(action));
  }
}

TEST_F(TighteningTest, OfferedSeccompRuleDroppedOrChangedIsRefused) {
  base_.seccomp.syscalls = {rule({"ptrace"}, "SCMP_ACT_ERRNO"), rule({"kcmp"}, "SCMP_ACT_KILL")};
  Policy dropped = base_;
  dropped.seccomp.syscalls.erase(dropped.seccomp.syscalls.begin());
  EXPECT_EQ(only_loosening(dropped).path, "seccomp.syscalls");
  EXPECT_THAT(only_loosening(dropped).message, HasSubstr("seccomp.syscalls[0] (ptrace"));

  Policy errno_changed = base_;
  errno_changed.seccomp.syscalls[0].errno_ret = 0;
  EXPECT_EQ(only_loosening(errno_changed).path, "seccomp.syscalls");

  Policy relaxed = base_;
  relaxed.seccomp.syscalls[1].action = "SCMP_ACT_LOG";
  EXPECT_THAT(paths_of(loosenings(base_, relaxed, {})),
              ElementsAre("seccomp.syscalls", "seccomp.syscalls[1].action"));

  Policy narrowed = base_;  // a condition on the rule lets every other call through
  narrowed.seccomp.syscalls[0].args.push_back(SeccompArg{0, 1, 0, "SCMP_CMP_EQ"});
  EXPECT_EQ(only_loosening(narrowed).path, "seccomp.syscalls");

  Policy reordered = base_;
  std::swap(reordered.seccomp.syscalls[0], reordered.seccomp.syscalls[1]);
  EXPECT_EQ(only_loosening(reordered).path, "seccomp.syscalls");
}

TEST_F(TighteningTest, LooserSeccompDefaultIsRefused) {
  base_.seccomp.default_action = "SCMP_ACT_KILL_PROCESS";
  for (const char* action : {"SCMP_ACT_KILL", "SCMP_ACT_ERRNO", "SCMP_ACT_LOG", "SCMP_ACT_ALLOW"}) {
    Policy candidate = base_;
    candidate.seccomp.default_action = action;
    EXPECT_EQ(only_loosening(candidate).path, "seccomp.defaultAction") << action;
  }
}

// ---- mounts ------------------------------------------------------------------------------------

TEST_F(TighteningTest, OfferedMountsMayBeMadeReadOnlyShrunkOrDropped) {
  Policy candidate = base_;
  auto& mounts = candidate.filesystem.mounts;
  ASSERT_EQ(mounts.back().target, "/tmp");
  mounts.back().readonly = true;
  mounts.back().size_bytes = 1 << 20;
  mounts.erase(mounts.begin() + 1);  // /bin
  expect_accepted(candidate);
}

TEST_F(TighteningTest, OfferedReadOnlyBindMadeWritableIsRefused) {
  Policy candidate = base_;
  candidate.filesystem.mounts[0].readonly = false;  // /usr
  const auto found = only_loosening(candidate);
  EXPECT_EQ(found.path, "filesystem.mounts[0].readonly");
  EXPECT_THAT(found.message, HasSubstr("/usr read-only"));
}

TEST_F(TighteningTest, LargerOrAddedTmpfsIsRefused) {
  Policy larger = base_;
  larger.filesystem.mounts.back().size_bytes = 128ull << 20;
  const auto found = only_loosening(larger);
  EXPECT_EQ(found.path, "filesystem.mounts[9].size");
  EXPECT_EQ(found.message, "128M is above the offered policy's 64M for /tmp");

  Policy added = base_;
  added.filesystem.mounts.push_back(tmpfs("/scratch", 4096));
  EXPECT_EQ(only_loosening(added).path, "filesystem.mounts[10]");
}

TEST_F(TighteningTest, OfferedSourceAtAnotherTargetIsANewBind) {
  Policy candidate = base_;
  candidate.filesystem.mounts[0].target = "/opt";  // /usr at /opt: not an offered mount
  EXPECT_EQ(only_loosening(candidate).path, "filesystem.mounts[0].source");
}

TEST_F(TighteningTest, DroppingAMountThatHidesPartOfAnotherIsRefused) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("data/secret"));
  base_.filesystem.mounts.push_back(bind_mount(dir.file("data"), "/data"));
  base_.filesystem.mounts.push_back(tmpfs("/data/secret"));
  Policy candidate = base_;
  candidate.filesystem.mounts.pop_back();
  const auto found = only_loosening(candidate);
  EXPECT_EQ(found.path, "filesystem.mounts");
  EXPECT_THAT(found.message, HasSubstr("tmpfs at /data/secret"));
  candidate.filesystem.mounts.pop_back();  // dropping both uncovers nothing
  expect_accepted(candidate);
}

class BindSourceTest : public TighteningTest {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.file("permitted/sub"));
    std::filesystem::create_directories(dir_.file("permittedness"));
    std::filesystem::create_directories(dir_.file("outside"));
  }
  Policy with(Mount mount) const {
    Policy policy = base_;
    policy.filesystem.mounts.push_back(std::move(mount));
    return policy;
  }
  std::vector<PermittedBind> read_only() const { return {{dir_.file("permitted"), false}}; }
  std::vector<PermittedBind> writable() const { return {{dir_.file("permitted"), true}}; }

  test::TempDir dir_;
};

TEST_F(BindSourceTest, BindBeneathAPermittedDirectoryIsAccepted) {
  expect_accepted(with(bind_mount(dir_.file("permitted"), "/data")), read_only());
  expect_accepted(with(bind_mount(dir_.file("permitted/sub"), "/data")), read_only());
  expect_accepted(with(bind_mount(dir_.file("permitted/sub"), "/data", false)), writable());
}

TEST_F(BindSourceTest, BindOutsideWhatIsPermittedIsRefused) {
  const auto found = only_loosening(with(bind_mount("/etc", "/data")), read_only());
  EXPECT_EQ(found.path, "filesystem.mounts[10].source");
  EXPECT_THAT(found.message, HasSubstr("this client may bind beneath " + dir_.file("permitted")));
  EXPECT_EQ(only_loosening(with(bind_mount(dir_.file("outside"), "/data"))).path,
            "filesystem.mounts[10].source")
      << "nothing permitted";
  // A sibling whose name only starts with the permitted directory's is not beneath it.
  EXPECT_EQ(only_loosening(with(bind_mount(dir_.file("permittedness"), "/data")), read_only()).path,
            "filesystem.mounts[10].source");
  EXPECT_EQ(
      only_loosening(with(bind_mount(dir_.file("permitted/../outside"), "/data")), read_only())
          .path,
      "filesystem.mounts[10].source");
}

TEST_F(BindSourceTest, ReadWriteBindOfAReadOnlyPermissionIsRefused) {
  const auto found =
      only_loosening(with(bind_mount(dir_.file("permitted/sub"), "/data", false)), read_only());
  EXPECT_EQ(found.path, "filesystem.mounts[10].readonly");
  EXPECT_THAT(found.message, HasSubstr("may only be bound read-only"));
}

TEST_F(BindSourceTest, SymlinkedSourceLeadingOutsideIsRefused) {
  std::filesystem::create_directory_symlink(dir_.file("outside"), dir_.file("permitted/link"));
  std::filesystem::create_directory_symlink("/etc", dir_.file("permitted/etc"));
  auto found = only_loosening(with(bind_mount(dir_.file("permitted/link"), "/data")), read_only());
  EXPECT_EQ(found.path, "filesystem.mounts[10].source");
  EXPECT_THAT(found.message, HasSubstr("resolved: " + dir_.file("outside")));
  found = only_loosening(with(bind_mount(dir_.file("permitted/etc"), "/data")), read_only());
  EXPECT_THAT(found.message, HasSubstr("resolved: /etc"));
}

TEST_F(BindSourceTest, SymlinksThatStayBeneathAreFollowed) {
  std::filesystem::create_directory_symlink("sub", dir_.file("permitted/inner"));
  expect_accepted(with(bind_mount(dir_.file("permitted/inner"), "/data")), read_only());
  // The permitted directory is itself resolved: a link to it permits what lies beneath its target.
  std::filesystem::create_directory_symlink(dir_.file("permitted"), dir_.file("alias"));
  expect_accepted(with(bind_mount(dir_.file("permitted/sub"), "/data")),
                  {{dir_.file("alias"), false}});
}

TEST_F(BindSourceTest, MissingSourceIsRefusedUnlessOptional) {
  const auto found =
      only_loosening(with(bind_mount(dir_.file("permitted/missing"), "/data")), read_only());
  EXPECT_EQ(found.path, "filesystem.mounts[10].source");
  EXPECT_THAT(found.message, HasSubstr("must exist"));
  Mount optional = bind_mount(dir_.file("permitted/missing"), "/data");
  optional.optional = true;
  expect_accepted(with(optional), read_only());
  optional.source = dir_.file("outside/missing");
  EXPECT_EQ(only_loosening(with(optional), read_only()).path, "filesystem.mounts[10].source");
}

TEST_F(BindSourceTest, PermissionThatIsNotAnAbsoluteDirectoryPermitsNothing) {
  EXPECT_EQ(only_loosening(with(bind_mount(dir_.file("permitted"), "/data")), {{"", true}}).path,
            "filesystem.mounts[10].source");
  EXPECT_EQ(only_loosening(with(bind_mount(dir_.file("permitted"), "/data")),
                           {{dir_.file("no-such-dir"), true}})
                .path,
            "filesystem.mounts[10].source");
}

}  // namespace
}  // namespace rlm
