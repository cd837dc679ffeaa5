// RootfsPlan against the real kernel: the sandbox's filesystem as seen from inside.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "child_setup_harness.hpp"
#include "rlm_sandbox/error.hpp"
#include "support/host_probes.hpp"
#include "support/subprocess.hpp"

namespace rlm::ns::test {
namespace {

class Rootfs : public ::testing::Test {
 protected:
  // Every test also shows that nothing was mounted (or left mounted) on the host: in a copy of
  // its mount table that only this process and its sandboxes change (see host_probes.hpp).
  void SetUp() override {
    rlm::test::isolate_mount_table();
    before_ = rlm::test::mount_table();
  }
  void TearDown() override {
    EXPECT_EQ(rlm::test::mount_table_since(before_), before_) << "the host's mount table changed";
  }

  // Runs `script` under policy_ and expects it to succeed.
  SandboxRun check(const std::string& script) {
    SandboxRun run = run_script(policy_, script);
    EXPECT_EQ(run.exit_code, 0) << "script: " << script << "\nstdout: " << run.out
                                << "\nstderr: " << run.err;
    return run;
  }

  Policy policy_ = test_policy();
  std::set<std::string> before_;
};

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Why prepare() refuses `policy`; nullopt when it accepts it.
std::optional<std::string> refusal(const Policy& policy) {
  try {
    RootfsPlan::prepare(policy);
    return std::nullopt;
  } catch (const Error& e) {
    return e.what();
  }
}

// `policy` with `mount` added last.
Policy with_mount(Policy policy, const Mount& mount) {
  policy.filesystem.mounts.push_back(mount);
  return policy;
}

// The JSON path of the policy's last mount's `field`, as prepare() names it.
std::string last_mount_path(const Policy& policy, const std::string& field) {
  return "filesystem.mounts[" + std::to_string(policy.filesystem.mounts.size() - 1) + "]." + field;
}

bool has_option(const std::string& options, const std::string& option) {
  return ("," + options + ",").find("," + option + ",") != std::string::npos;
}

TEST_F(Rootfs, RootIsAReadOnlyTmpfsHoldingOnlyWhatThePolicyNames) {
  const auto run = check(
      "ls -A /; echo ---; cat /proc/self/mountinfo; echo ---; "
      "touch /new-file 2>&1 || true; mkdir /new-dir 2>&1 || true");
  std::istringstream in(run.out);
  std::string listing, mountinfo, errors, line;
  std::string* sink = &listing;
  while (std::getline(in, line)) {
    if (line == "---") {
      sink = sink == &listing ? &mountinfo : &errors;
      continue;
    }
    *sink += line + "\n";
  }
  // The default policy's binds (/bin /lib /lib64 /sbin are symlinks to usr/... here), the probe,
  // what the sandbox itself provides, and no trace of the host root.
  std::vector<std::string> expected = {"dev", "etc", "probe", "proc", "tmp", "usr"};
  for (const char* optional : {"bin", "lib", "lib64", "sbin"})
    if (access((std::string("/") + optional).c_str(), F_OK) == 0) expected.push_back(optional);
  std::sort(expected.begin(), expected.end());
  auto listed = words(listing);
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed, expected);

  const std::string root = mount_options(mountinfo, "/");
  EXPECT_TRUE(has_option(root, "ro")) << root;
  EXPECT_TRUE(has_option(root, "nosuid")) << root;
  EXPECT_TRUE(has_option(root, "nodev")) << root;
  EXPECT_TRUE(lines_with(mountinfo, ".rlm-old-root").empty()) << mountinfo;
  EXPECT_EQ(lines_with(errors, "Read-only file system").size(), 2u) << errors;
}

TEST_F(Rootfs, UsrIsReadableButNotWritable) {
  const auto run = check(
      "test -r /usr/bin/env && head -c 4 /usr/bin/env | od -c | head -1; "
      "touch /usr/rlm-probe 2>&1 || true; grep ' /usr ' /proc/self/mountinfo");
  EXPECT_NE(run.out.find("E   L   F"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("Read-only file system"), std::string::npos) << run.out;
  const std::string options = mount_options(run.out, "/usr");
  EXPECT_TRUE(has_option(options, "ro")) << options;
  EXPECT_TRUE(has_option(options, "nosuid")) << options;
  EXPECT_TRUE(has_option(options, "nodev")) << options;
}

TEST_F(Rootfs, HostSymlinksAreRecreatedSoBinShRuns) {
  if (!std::filesystem::is_symlink("/bin")) GTEST_SKIP() << "/bin is not a symlink on this host";
  const auto run = check("readlink /bin; /bin/sh -c 'echo nested shell ran'");
  EXPECT_EQ(run.out, std::filesystem::read_symlink("/bin").string() + "\nnested shell ran\n");
}

TEST_F(Rootfs, TmpIsWritableNosuidAndCappedBySize) {
  const auto run = check(
      "echo hello > /tmp/file && cat /tmp/file; grep ' /tmp ' /proc/self/mountinfo; "
      "dd if=/dev/zero of=/tmp/big bs=64k count=32 2>&1 || echo dd failed; "
      "ls -ld /tmp | cut -c1-10");
  EXPECT_NE(run.out.find("hello\n"), std::string::npos) << run.out;
  const std::string options = mount_options(run.out, "/tmp");
  EXPECT_TRUE(has_option(options, "rw")) << options;
  EXPECT_TRUE(has_option(options, "nosuid")) << options;
  EXPECT_TRUE(has_option(options, "nodev")) << options;
  // 2 MiB into a 1 MiB tmpfs.
  EXPECT_NE(run.out.find("No space left on device"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("dd failed"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("drwxrwxrwt"), std::string::npos) << run.out;
}

TEST_F(Rootfs, HostFilesOutsideTheBindsAreInvisible) {
  const std::string secret = "/root/rlm-child-setup-secret-" + std::to_string(getpid());
  std::ofstream(secret) << "secret\n";
  rlm::test::TempDir host_tmp;  // under the host's /tmp, which the sandbox replaces
  host_tmp.write("visible-on-host", "x");
  chmod(host_tmp.path().c_str(), 0755);
  const auto run = run_script(policy_, "for p in " + secret + " " + host_tmp.path() +
                                           " /work /home /root; do test -e $p && echo $p; done; "
                                           "echo done");
  std::filesystem::remove(secret);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "done\n");
  // Control: the same loop on the host does see them.
  const auto host =
      rlm::test::run_process({"/bin/sh", "-c", "test -e " + host_tmp.path() + " && echo seen"});
  EXPECT_EQ(host.out, "seen\n");
}

TEST_F(Rootfs, BindSourcesAnywhereOnTheHostIncludingUnderTmp) {
  rlm::test::TempDir data;  // /tmp/...: covered by the staging tmpfs, reached via the old root
  data.write("hello", "from the host\n");
  chmod(data.path().c_str(), 0777);
  chmod(data.file("hello").c_str(), 0644);
  Mount ro;
  ro.source = data.path();
  ro.target = "/data/ro";
  Mount rw = ro;
  rw.target = "/data/rw";
  rw.readonly = false;
  policy_.filesystem.mounts.push_back(ro);
  policy_.filesystem.mounts.push_back(rw);
  const auto run = check(
      "cat /data/ro/hello; touch /data/ro/new 2>&1 || true; echo written > /data/rw/new; "
      "grep ' /data/' /proc/self/mountinfo");
  EXPECT_NE(run.out.find("from the host\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("Read-only file system"), std::string::npos) << run.out;
  EXPECT_EQ(data.read("new"), "written\n");
  const std::string rw_options = mount_options(run.out, "/data/rw");
  EXPECT_TRUE(has_option(rw_options, "rw")) << rw_options;
  EXPECT_TRUE(has_option(rw_options, "nosuid")) << rw_options;
  EXPECT_TRUE(has_option(rw_options, "nodev")) << rw_options;
}

TEST_F(Rootfs, MountsBelowAReadOnlyBindSourceAreReadOnlyToo) {
  // The host's /dev/shm is a writable (1777) tmpfs mounted below /dev; bound recursively under a
  // read-only bind of /dev, it must not stay writable.
  if (mount_options(rlm::test::mountinfo(), "/dev/shm").empty())
    GTEST_SKIP() << "no /dev/shm mount";
  const std::string name = "rlm-child-setup-" + std::to_string(getpid());
  Mount dev;
  dev.source = "/dev";
  dev.target = "/hostdev";
  policy_.filesystem.mounts.push_back(dev);
  const auto run = check("touch /hostdev/shm/" + name +
                         " 2>&1 || true; grep ' /hostdev/shm ' /proc/self/mountinfo");
  std::filesystem::remove("/dev/shm/" + name);
  EXPECT_NE(run.out.find("Read-only file system"), std::string::npos) << run.out;
  const std::string options = mount_options(run.out, "/hostdev/shm");
  EXPECT_TRUE(has_option(options, "ro")) << options;
  EXPECT_TRUE(has_option(options, "nosuid")) << options;
}

TEST_F(Rootfs, ProcBelongsToTheSandboxPidNamespace) {
  const auto run = check(
      "echo pid=$$; cat /proc/1/cmdline | tr '\\0' ' '; echo; "
      "ls /proc | grep -c '^[0-9][0-9]*$'");
  const auto lines = words(run.out);
  EXPECT_EQ(run.out.substr(0, 6), "pid=1\n") << run.out;
  EXPECT_NE(run.out.find("/bin/sh -c"), std::string::npos) << run.out;
  // sh, ls and grep at most.
  ASSERT_FALSE(lines.empty());
  EXPECT_LE(std::stoi(lines.back()), 3) << run.out;
}

TEST_F(Rootfs, SensitiveProcEntriesAreMaskedAndTunablesReadOnly) {
  std::vector<std::string> files, dirs;
  for (const char* name : {"kcore", "keys", "kallsyms", "timer_list", "sysrq-trigger", "kmsg"})
    if (std::filesystem::exists(std::string("/proc/") + name)) files.push_back(name);
  for (const char* name : {"acpi", "scsi", "driver"})
    if (std::filesystem::is_directory(std::string("/proc/") + name)) dirs.push_back(name);
  if (!std::filesystem::exists("/proc/kcore"))
    std::cout << "note: this kernel has no /proc/kcore; checking the entries it has\n";
  ASSERT_FALSE(files.empty());

  std::string script;
  for (const auto& f : files) script += "echo " + f + "=$(wc -c < /proc/" + f + ");";
  for (const auto& d : dirs) script += "echo " + d + "=$(ls -A /proc/" + d + " | wc -l);";
  script += "echo 1 > /proc/sys/kernel/hostname 2>/dev/null || echo sysctl-write-refused;";
  script += "cat /proc/self/mountinfo";
  const auto run = check(script);
  for (const auto& f : files) {
    // Unmasked, these are unreadable to the sandbox user (kcore, kmsg) or non-empty.
    EXPECT_NE(run.out.find(f + "=0\n"), std::string::npos) << f << "\n" << run.out;
    EXPECT_FALSE(mount_options(run.out, "/proc/" + f).empty()) << f;
  }
  for (const auto& d : dirs) {
    EXPECT_NE(run.out.find(d + "=0\n"), std::string::npos) << d << "\n" << run.out;
    EXPECT_TRUE(has_option(mount_options(run.out, "/proc/" + d), "ro")) << d;
  }
  for (const char* ro : {"/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs"}) {
    if (!std::filesystem::exists(ro)) continue;
    EXPECT_TRUE(has_option(mount_options(run.out, ro), "ro")) << ro << "\n" << run.out;
  }
  EXPECT_NE(run.out.find("sysctl-write-refused"), std::string::npos);
  const std::string proc = mount_options(run.out, "/proc");
  for (const char* option : {"nosuid", "nodev", "noexec"})
    EXPECT_TRUE(has_option(proc, option)) << proc;
}

TEST_F(Rootfs, DevHoldsOnlyTheHarmlessDevices) {
  const auto run = check(
      "ls -A /dev | tr '\\n' ' '; echo; echo x > /dev/null && echo null-ok; "
      "head -c 4 /dev/zero | wc -c; head -c 8 /dev/urandom | wc -c; "
      "echo x > /dev/full 2>/dev/null || echo full-refused; "
      "touch /dev/new 2>&1 || true; echo shm > /dev/shm/f && cat /dev/shm/f; "
      "readlink /dev/ptmx /dev/fd /dev/stdin; test -c /dev/pts/ptmx && echo pts-ok; "
      "test -e /dev/sda || test -e /dev/vda || echo no-disks");
  std::vector<std::string> expected = {"fd",     "full",    "null",   "ptmx",  "pts",
                                       "random", "shm",     "stderr", "stdin", "stdout",
                                       "tty",    "urandom", "zero"};
  std::istringstream in(run.out);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(words(first), expected) << run.out;
  for (const char* marker :
       {"null-ok\n", "\n4\n8\n", "full-refused\n", "Read-only file system", "shm\n",
        "pts/ptmx\n/proc/self/fd\n/proc/self/fd/0\n", "pts-ok\n", "no-disks\n"})
    EXPECT_NE(run.out.find(marker), std::string::npos) << marker << "\n" << run.out;
}

TEST_F(Rootfs, EtcPasswdAndGroupNameTheSandboxUser) {
  const auto run = check("cat /etc/passwd /etc/group; id -u; id -g; hostname");
  EXPECT_NE(run.out.find("sandbox:x:1000:1000:sandbox:/tmp:/bin/sh\n"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("nobody:x:65534:65534:"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("sandbox:x:1000:\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("\n1000\n1000\nsandbox\n"), std::string::npos) << run.out;
}

TEST_F(Rootfs, WorkdirIsCreatedAndIsTheCwd) {
  policy_.filesystem.workdir = "/work/sub";
  const auto run = check("pwd; ls -ld /work/sub | cut -c1-10");
  EXPECT_EQ(run.out, "/work/sub\ndrwxr-xr-x\n");
}

TEST_F(Rootfs, WorkdirInsideAWritableTmpfsIsWritable) {
  policy_.filesystem.workdir = "/tmp/job";
  const auto run = check("pwd; echo x > here && echo wrote");
  EXPECT_EQ(run.out, "/tmp/job\nwrote\n");
}

TEST_F(Rootfs, MissingWorkdirUnderAReadOnlyMountFailsWithANamedStep) {
  policy_.filesystem.workdir = "/usr/rlm-no-such-dir";
  const auto run = run_script(policy_, "pwd");
  EXPECT_EQ(run.exit_code, 125);
  EXPECT_NE(run.err.find("step failed: create workdir /usr/rlm-no-such-dir: errno " +
                         std::to_string(EROFS)),
            std::string::npos)
      << run.err;
}

TEST_F(Rootfs, NoPathIsResolvedThroughALinkInABind) {
  // A read-write bind holding a link to where the host root sits while the tree is built, as an
  // earlier run could leave it; the workdir and a mount target through it must not reach the host.
  rlm::test::TempDir data;
  chmod(data.path().c_str(), 0777);
  ASSERT_EQ(symlink("/.rlm-old-root/tmp", data.file("w").c_str()), 0);
  const std::string name = "rlm-child-setup-link-" + std::to_string(getpid());
  Mount rw;
  rw.source = data.path();
  rw.target = "/data";
  rw.readonly = false;
  policy_.filesystem.mounts.push_back(rw);
  {
    Policy policy = policy_;
    policy.filesystem.workdir = "/data/w/" + name;
    const auto run = run_script(policy, "pwd");
    EXPECT_FALSE(std::filesystem::exists("/tmp/" + name)) << "the workdir was made on the host";
    std::filesystem::remove_all("/tmp/" + name);
    EXPECT_EQ(run.exit_code, 125);
    EXPECT_NE(run.err.find("step failed: create workdir /data/w/" + name + ": errno " +
                           std::to_string(ELOOP)),
              std::string::npos)
        << run.err;
  }
  {
    Policy policy = policy_;
    Mount tmpfs;
    tmpfs.type = Mount::Type::tmpfs;
    tmpfs.target = "/data/w/" + name;
    policy.filesystem.mounts.push_back(tmpfs);
    const auto run = run_script(policy, "pwd");
    EXPECT_FALSE(std::filesystem::exists("/tmp/" + name)) << "the mount point was made on the host";
    std::filesystem::remove_all("/tmp/" + name);
    EXPECT_EQ(run.exit_code, 125);
    EXPECT_NE(run.err.find("errno " + std::to_string(ELOOP)), std::string::npos) << run.err;
  }
  // A link as the mount point itself is not followed either.
  {
    Policy policy = policy_;
    Mount tmpfs;
    tmpfs.type = Mount::Type::tmpfs;
    tmpfs.target = "/data/w";
    policy.filesystem.mounts.push_back(tmpfs);
    const auto run = run_script(policy, "pwd");
    EXPECT_EQ(run.exit_code, 125) << run.out;
    EXPECT_NE(run.err.find("errno " + std::to_string(ELOOP)), std::string::npos) << run.err;
  }
}

TEST_F(Rootfs, BindSourcesFollowOnlyLinksOwnedByRootOrTheRuntime) {
  rlm::test::TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ASSERT_EQ(mkdir(dir.file("real").c_str(), 0755), 0);
  dir.write("real/hello", "through the link\n");
  chmod(dir.file("real/hello").c_str(), 0644);
  // Owned by this (the runtime's) user: followed, at the last component and in the middle.
  ASSERT_EQ(symlink("real", dir.file("trusted").c_str()), 0);
  Mount mount;
  mount.source = dir.file("trusted");
  mount.target = "/data";
  Mount inner = mount;
  inner.source = dir.file("trusted") + "/hello";
  inner.target = "/hello";
  Policy policy = policy_;
  policy.filesystem.mounts.push_back(mount);
  policy.filesystem.mounts.push_back(inner);
  const auto run = run_script(policy, "cat /data/hello /hello");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "through the link\nthrough the link\n");

  // Owned by the uid sandboxes run as, as a link planted through a read-write bind would be.
  ASSERT_EQ(symlink("real", dir.file("planted").c_str()), 0);
  ASSERT_EQ(lchown(dir.file("planted").c_str(), 65534, 65534), 0);
  for (const std::string& source : {dir.file("planted"), dir.file("planted") + "/hello"}) {
    Mount m;
    m.source = source;
    m.target = "/data";
    const Policy refused = with_mount(policy_, m);
    const std::string path = last_mount_path(refused, "source");
    const auto error = refusal(refused);
    if (!error)
      ADD_FAILURE() << "prepare() followed " << source;
    else
      EXPECT_NE(error->find(path + ": " + dir.file("planted") + " is a symlink owned by uid 65534"),
                std::string::npos)
          << *error;
  }
}

// A root owner's sandbox writes as root (idmapped), so the directories it wrote carry a mark that
// only host root can set or remove, and beneath one even root's own links are not followed.
TEST_F(Rootfs, BindSourcesFollowNoLinkBeneathADirectoryASandboxWrote) {
  if (geteuid() != 0) GTEST_SKIP() << "trusted attributes are host root's only";
  rlm::test::TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ASSERT_EQ(mkdir(dir.file("out").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.file("out/sub").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.file("real").c_str(), 0755), 0);
  dir.write("real/hello", "through the link\n");
  chmod(dir.file("real/hello").c_str(), 0644);
  ASSERT_EQ(symlink("../../real", dir.file("out/sub/link").c_str()), 0);  // root's
  Mount mount;
  mount.source = dir.file("out/sub/link");
  mount.target = "/data";
  const Policy policy = with_mount(policy_, mount);
  ASSERT_FALSE(refusal(policy)) << "a root-owned link in an unmarked directory is followed";

  ASSERT_EQ(setxattr(dir.file("out").c_str(), "trusted.rlm-sandbox.written", "1", 1, 0), 0)
      << strerror(errno);
  for (const std::string& source : {dir.file("out/sub/link"), dir.file("out/sub/link/hello")}) {
    Mount m;
    m.source = source;
    m.target = "/data";
    const Policy refused = with_mount(policy_, m);
    const auto error = refusal(refused);
    if (!error) {
      ADD_FAILURE() << "prepare() followed " << source;
      continue;
    }
    EXPECT_NE(error->find(last_mount_path(refused, "source") + ": " + dir.file("out/sub/link") +
                          " is a symlink in " + dir.file("out") + ", which a sandbox wrote"),
              std::string::npos)
        << *error;
    EXPECT_NE(error->find("setfattr -x trusted.rlm-sandbox.written " + dir.file("out")),
              std::string::npos)
        << *error;
  }
  // The marked directory itself, and what is in it, are still bound: only links are refused.
  Mount plain;
  plain.source = dir.file("out/sub");
  plain.target = "/data";
  EXPECT_FALSE(refusal(with_mount(policy_, plain)));
}

// A link root owns is only as trustworthy as whoever may put it where it is: one moved by another
// user into a directory of theirs, or into one everybody may write, is not followed.
TEST_F(Rootfs, BindSourcesFollowNoLinkInADirectoryOthersMayWrite) {
  if (geteuid() != 0) GTEST_SKIP() << "only root can make a link root owns for another's directory";
  rlm::test::TempDir dir;
  chmod(dir.path().c_str(), 0755);
  ASSERT_EQ(mkdir(dir.file("real").c_str(), 0755), 0);
  for (const auto& [name, mode, owner] :
       {std::tuple{"open", 0777, 0}, std::tuple{"users", 0755, 65534},
        std::tuple{"group", 0775, 65534}}) {
    const std::string holder = dir.file(name);
    ASSERT_EQ(mkdir(holder.c_str(), 0700), 0);
    ASSERT_EQ(chmod(holder.c_str(), static_cast<mode_t>(mode)), 0);
    ASSERT_EQ(chown(holder.c_str(), static_cast<uid_t>(owner), static_cast<gid_t>(owner)), 0);
    ASSERT_EQ(symlink("../real", (holder + "/link").c_str()), 0);  // root's
    Mount m;
    m.source = holder + "/link";
    m.target = "/data";
    const Policy refused = with_mount(policy_, m);
    const auto error = refusal(refused);
    if (!error) {
      ADD_FAILURE() << "prepare() followed " << m.source;
      continue;
    }
    EXPECT_NE(error->find(m.source + " is a symlink in " + holder), std::string::npos) << *error;
    EXPECT_NE(error->find("who could have put it there"), std::string::npos) << *error;
  }
  // The same link in a directory only root may write is followed.
  ASSERT_EQ(symlink("real", dir.file("link").c_str()), 0);
  Mount trusted;
  trusted.source = dir.file("link");
  trusted.target = "/data";
  EXPECT_FALSE(refusal(with_mount(policy_, trusted)));
}

TEST_F(Rootfs, ADescriptorOpenedBeforeTheNamespacesStillExecsAfterPivotRoot) {
  // The backend execs rlm-sandbox-init this way: the file lives on the host root, which is
  // detached by then. The probe is not bound into this sandbox at all.
  policy_.filesystem.mounts.pop_back();
  const int fd = open(probe_path().c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const auto run = run_in_sandbox(policy_, {"probe", "loopback"}, {.exec_fd = fd});
  close(fd);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.out, "ok\n");
  const auto absent = run_script(policy_, "test -e /probe || echo absent");
  EXPECT_EQ(absent.out, "absent\n");
}

TEST_F(Rootfs, MissingBindSourceIsAnErrorWithItsJsonPath) {
  Mount missing;
  missing.source = "/rlm-no-such-source";
  missing.target = "/opt/x";
  policy_.filesystem.mounts.insert(policy_.filesystem.mounts.begin() + 3, missing);
  const auto error = refusal(policy_);
  if (!error) FAIL() << "prepare() accepted a missing source";
  EXPECT_NE(error->find("filesystem.mounts[3].source"), std::string::npos) << *error;
  EXPECT_NE(error->find("/rlm-no-such-source"), std::string::npos) << *error;
}

TEST_F(Rootfs, MissingOptionalBindIsSkipped) {
  Mount missing;
  missing.source = "/rlm-no-such-source";
  missing.target = "/opt/x";
  missing.optional = true;
  policy_.filesystem.mounts.push_back(missing);
  const auto run = check("test -e /opt && echo present || echo absent");
  EXPECT_EQ(run.out, "absent\n");
}

TEST_F(Rootfs, TargetsTheSandboxBuildsItselfAreRefused) {
  for (const char* target : {"/proc/x", "/dev/kvm", "/", "/a/../b"}) {
    Mount mount;
    mount.type = Mount::Type::tmpfs;
    mount.target = target;
    const Policy policy = with_mount(policy_, mount);
    const auto error = refusal(policy);
    if (!error)
      ADD_FAILURE() << "accepted " << target;
    else
      EXPECT_NE(error->find(last_mount_path(policy, "target")), std::string::npos) << *error;
  }
}

}  // namespace
}  // namespace rlm::ns::test
