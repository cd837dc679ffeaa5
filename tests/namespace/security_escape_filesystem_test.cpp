// Escape attempts through the filesystem from inside the default sandbox on the namespace backend:
// host secrets, writes outside /tmp, /tmp's cap, and paths through links a payload planted. Each is
// tried for real from inside (and the host looked at afterwards), never checked in the
// configuration.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

// ---- Filesystem ---------------------------------------------------------------------------------

// A file planted on the host for the duration of a test, removed however the test ends.
class PlantedFile {
 public:
  PlantedFile(std::string path, const std::string& content) : path_(std::move(path)) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~PlantedFile() { ::unlink(path_.c_str()); }
  PlantedFile(const PlantedFile&) = delete;
  PlantedFile& operator=(const PlantedFile&) = delete;
  const std::string& path() const { return path_; }
  bool exists() const { return ::access(path_.c_str(), F_OK) == 0; }

 private:
  std::string path_;
};

TEST_F(NamespaceTest, HostSecretsAreAbsent) {
  const std::string token = random_token();
  const std::string content = "rlm-secret-content-" + token;
  PlantedFile root_secret("/root/rlm-secret-" + token, content);
  ASSERT_TRUE(root_secret.exists())
      << "cannot plant " << root_secret.path() << " (this suite runs as root)";
  test::TempDir host_tmp;  // a host /tmp directory: the sandbox's /tmp is its own
  host_tmp.write("rlm-secret-" + token, content);
  const std::string env_name = "RLM_SECRET_ENV_" + token;
  ::setenv(env_name.c_str(), content.c_str(), 1);

  auto result = python(R"PY(
import os
for i, path in enumerate([')PY" +
                       root_secret.path() + "', '" + host_tmp.file("rlm-secret-" + token) +
                       R"PY(']):
    try:
        with open(path, 'rb') as f:
            print('read%d READ %s' % (i, f.read().decode(errors='replace')))
    except OSError as e:
        print('read%d %s' % (i, type(e).__name__))
try:
    print('rootdir', ','.join(sorted(os.listdir('/root'))))
except OSError as e:
    print('rootdir', type(e).__name__)
hits = []
for top, dirs, files in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('usr', 'bin', 'sbin', 'lib', 'lib64', 'proc', 'sys', 'dev')]
    hits += [os.path.join(top, f) for f in files if f.startswith('rlm-secret-')]
print('hits', ' '.join(hits))
print('env', ' '.join(k for k in os.environ if k.startswith('RLM_SECRET_ENV_')))
)PY");
  ::unsetenv(env_name.c_str());
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["read0"], "FileNotFoundError") << "/root secret: " << v["read0"];
  EXPECT_EQ(v["read1"], "FileNotFoundError") << "host /tmp secret: " << v["read1"];
  EXPECT_EQ(v["rootdir"].find("rlm-secret-"), std::string::npos) << v["rootdir"];
  EXPECT_EQ(v["hits"], "") << "planted host files found inside the sandbox";
  EXPECT_EQ(v["env"], "") << "the host's environment leaked into the sandbox";
  EXPECT_EQ(result.stdout_data.find(content), std::string::npos) << result.stdout_data;
}

// /dev/stdin, /dev/stdout and /dev/stderr open by path (/proc/self/fd/N, which checks the pipe's
// own mode against the opener): many CI tools write to /dev/stdout. Under a root runtime the
// payload's uid is not the pipes' creator, and they were refused (Permission denied), directly
// and through the server (the client's pipes). host/stdio_pipe.hpp says why opening their mode
// gives nothing to anyone who does not hold them already.
TEST_F(NamespaceTest, StdioOpensByPath) {
  ProcessOptions piped;
  piped.stdin_data = "p\n";
  const auto cat = cli({"run", "--", "cat", "/dev/stdin"}, piped);
  EXPECT_EQ(cat.exit_code, 0) << cat.err;
  EXPECT_EQ(cat.out, "p\n");
  // -q: where no cgroup can be written (a container), the run's note about the stand-in limits
  // would follow the payload's own stderr.
  const auto written =
      cli({"run", "-q", "--", "sh", "-c", "echo out > /dev/stdout && echo err > /dev/stderr"});
  EXPECT_EQ(written.exit_code, 0) << written.err;
  EXPECT_EQ(written.out, "out\n");
  EXPECT_EQ(written.err, "err\n");

  Request request;
  request.argv = {"sh", "-c", "cat /dev/stdin > /dev/stdout; echo e > /dev/stderr"};
  request.stdin_data = "through the API\n";
  const auto result = run_request(request, policy_);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "through the API\n");
  EXPECT_EQ(result.stderr_data, "e\n");
}

TEST_F(NamespaceTest, WritesOutsideTmpFailAndTmpIsWritable) {
  const std::string token = random_token();
  const std::vector<std::string> dirs{"/", "/usr", "/etc", "/usr/bin", "/usr/lib", "/bin"};
  std::string list;
  for (const auto& dir : dirs) list += "'" + dir + "', ";
  // A world-writable host file under /usr: only the read-only mount can stop the writes to it.
  // (The VM lanes share the host's / read-only: no host file there can be written at all.)
  if (::access("/usr/lib", W_OK) != 0 && errno == EROFS)
    GTEST_SKIP() << "/usr is read-only on this host (tests/vm shares the host root read-only): "
                    "there is no writable host file to plant";
  PlantedFile planted("/usr/lib/rlm-sectest-" + token, "original");
  ASSERT_TRUE(planted.exists());
  ::chmod(planted.path().c_str(), 0666);

  auto result = python(R"PY(
import errno, os
name = 'rlm-write-)PY" +
                       token + R"PY('
planted = ')PY" + planted.path() +
                       R"PY('
def outcome(action):
    try:
        action()
        return 'SUCCEEDED'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
for d in [)PY" + list + R"PY(]:
    path = os.path.join(d, name)
    print('create:' + d, outcome(lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))))
    print('mkdir:' + d, outcome(lambda: os.mkdir(path + '.d')))
    print('symlink:' + d, outcome(lambda: os.symlink('/tmp', path + '.l')))
def append(path):
    with open(path, 'ab') as f:
        f.write(b'#')
print('append:/etc/passwd', outcome(lambda: append('/etc/passwd')))
print('append:planted', outcome(lambda: append(planted)))
print('truncate:planted', outcome(lambda: os.truncate(planted, 0)))
print('chmod:planted', outcome(lambda: os.chmod(planted, 0o777)))
print('rename:planted', outcome(lambda: os.rename(planted, planted + '.moved')))
print('unlink:planted', outcome(lambda: os.unlink(planted)))
# Kernel knobs and devices a container escape goes for: opening them is enough to show they
# are out of reach (nothing is ever written to them).
for path in ['/proc/sysrq-trigger', '/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe',
             '/proc/sys/vm/drop_caches', '/sys/kernel/uevent_helper', '/sys/fs/cgroup/cgroup.procs']:
    print('open_w:' + path, outcome(lambda: os.close(os.open(path, os.O_WRONLY))))
for path in ['/proc/kcore', '/dev/mem', '/dev/kmem', '/dev/port', '/dev/kmsg', '/dev/sda', '/dev/vda']:
    print('open_r:' + path, outcome(lambda: os.close(os.open(path, os.O_RDONLY))))
with open('/tmp/' + name, 'w') as f:
    f.write('x' * 4096)
with open('/tmp/' + name) as f:
    print('tmp', 'ok' if f.read() == 'x' * 4096 else 'MISMATCH')
)PY");

  // Whatever the sandbox managed to change on the host is undone before anything is asserted.
  std::vector<std::string> leaked;
  for (const auto& dir : dirs)
    for (const auto& suffix : {"", ".d", ".l"}) {
      std::string host_path = (dir == "/" ? "" : dir) + "/rlm-write-" + token + suffix;
      std::error_code ec;
      if (std::filesystem::symlink_status(host_path, ec).type() !=
          std::filesystem::file_type::not_found) {
        leaked.push_back(host_path + " created");
        std::filesystem::remove_all(host_path, ec);
      }
    }
  if (::unlink((planted.path() + ".moved").c_str()) == 0) leaked.push_back("planted file renamed");
  if (::unlink(("/tmp/rlm-write-" + token).c_str()) == 0)
    leaked.push_back("the sandbox's /tmp file landed in the host's /tmp");
  struct stat st {};
  if (::stat(planted.path().c_str(), &st) != 0)
    leaked.push_back("planted file removed");
  else if ((st.st_mode & 07777) != 0666)
    leaked.push_back("planted file's mode changed");
  if (read_file(planted.path()) != "original") leaked.push_back("planted file modified");

  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  for (const auto& dir : dirs)
    for (const char* action : {"create:", "mkdir:", "symlink:"}) {
      auto key = action + dir;
      EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
      EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
      // Read-only mounts, not just file permissions, stop them (the root is remounted read-only
      // and every system bind is read-only).
      EXPECT_EQ(v[key], "EROFS") << key;
    }
  for (const char* key : {"append:/etc/passwd", "append:planted", "truncate:planted",
                          "chmod:planted", "rename:planted", "unlink:planted"}) {
    EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
    EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
    EXPECT_EQ(v[key], "EROFS") << key;
  }
  for (const char* key :
       {"open_w:/proc/sysrq-trigger", "open_w:/proc/sys/kernel/core_pattern",
        "open_w:/proc/sys/kernel/modprobe", "open_w:/proc/sys/vm/drop_caches",
        "open_w:/sys/kernel/uevent_helper", "open_w:/sys/fs/cgroup/cgroup.procs",
        "open_r:/proc/kcore", "open_r:/dev/mem", "open_r:/dev/kmem", "open_r:/dev/port",
        "open_r:/dev/kmsg", "open_r:/dev/sda", "open_r:/dev/vda"}) {
    EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
    EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
  }
  EXPECT_EQ(v["tmp"], "ok") << describe(result);
  for (const auto& what : leaked) ADD_FAILURE() << "the sandbox changed the host: " << what;
}

// Fills /tmp with 1 MiB writes spread over files smaller than limits.file_size_bytes, so only the
// tmpfs size can stop it. Its files go in a directory of their own; should the sandbox's /tmp be
// the host's, the destructor removes them and the test fails.
class TmpFill {
 public:
  TmpFill() : dir_("/tmp/rlm-fill-" + random_token()) {}
  ~TmpFill() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TmpFill(const TmpFill&) = delete;
  TmpFill& operator=(const TmpFill&) = delete;
  bool landed_on_host() const { return ::access(dir_.c_str(), F_OK) == 0; }

  std::string script(int files, int mib_per_file) const {
    return R"PY(
import errno, os
chunk = b'\xa5' * (1 << 20)
total, err = 0, 'none'
os.mkdir(')PY" +
           dir_ + R"PY(')
try:
    for i in range()PY" +
           std::to_string(files) + R"PY():
        fd = os.open(')PY" +
           dir_ + R"PY(/fill%d' % i, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for _ in range()PY" +
           std::to_string(mib_per_file) + R"PY():
                total += os.write(fd, chunk)
        finally:
            os.close(fd)
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print('total', total)
print('err', err)
)PY";
  }

 private:
  std::string dir_;
};

TEST_F(NamespaceTest, TmpIsCappedAtTheDefaultTmpfsBytes) {
  const auto cap = policy_.limits.tmpfs_bytes;
  ASSERT_EQ(cap, 64ull << 20) << "the shipped default policy's limits.tmpfs_bytes changed";
  TmpFill fill;
  auto result = python(fill.script(12, 8));  // 96 MiB in 8 MiB files
  EXPECT_FALSE(fill.landed_on_host()) << "the sandbox's /tmp is the host's /tmp";
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["err"], "ENOSPC") << result.stdout_data;
  auto total = std::stoull(v["total"]);
  EXPECT_LE(total, cap) << "wrote more than limits.tmpfs_bytes into /tmp";
  EXPECT_GE(total, cap - (4ull << 20)) << "/tmp holds much less than limits.tmpfs_bytes";
}

TEST_F(NamespaceTest, TmpFollowsThePolicysTmpfsBytes) {
  Policy policy = policy_;
  policy.limits.tmpfs_bytes = 8ull << 20;
  TmpFill fill;
  auto result = python(fill.script(12, 1), policy);  // 12 MiB
  EXPECT_FALSE(fill.landed_on_host()) << "the sandbox's /tmp is the host's /tmp";
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["err"], "ENOSPC") << result.stdout_data;
  auto total = std::stoull(v["total"]);
  EXPECT_LE(total, 8ull << 20);
  EXPECT_GE(total, 6ull << 20);
}

// ---- Paths through links the payload planted ----------------------------------------------------

// A host path the attacks below aim at, removed (and reported) if it appears.
class HostTarget {
 public:
  HostTarget() : path_("/tmp/rlm-escape-" + random_token()) {}
  ~HostTarget() { removed(); }
  HostTarget(const HostTarget&) = delete;
  HostTarget& operator=(const HostTarget&) = delete;
  const std::string& path() const { return path_; }
  std::string name() const { return path_.substr(5); }
  // True when it existed (it is gone afterwards).
  bool removed() const {
    std::error_code ec;
    const bool existed =
        std::filesystem::symlink_status(path_, ec).type() != std::filesystem::file_type::not_found;
    std::filesystem::remove_all(path_, ec);
    return existed;
  }

 private:
  std::string path_;
};

TEST_F(NamespaceTest, CliWorkdirThroughAPlantedLinkCreatesNothingOnTheHost) {
  SharedDir shared;
  HostTarget target;
  // Run 1 plants a link to where the host root sits while the sandbox is built.
  auto plant = cli({"run", "--bind", shared.path() + ":/data", "--", "ln", "-s",
                    "/.rlm-old-root/tmp", "/data/w"});
  ASSERT_EQ(plant.exit_code, 0) << plant.err;
  ASSERT_TRUE(std::filesystem::is_symlink(shared.file("w")));
  // Run 2 is given a workdir through it.
  auto run2 = cli({"run", "--bind", shared.path() + ":/data", "--workdir",
                   "/data/w/" + target.name(), "--", "true"});
  EXPECT_FALSE(target.removed()) << "run 2 created " << target.path() << " on the host";
  EXPECT_EQ(run2.exit_code, 125) << run2.out << run2.err;
  EXPECT_NE(run2.err.find("workdir"), std::string::npos) << run2.err;
}

TEST_F(NamespaceTest, MountTargetsThroughAPlantedLinkCreateNothingOnTheHost) {
  SharedDir shared;
  auto plant = python("import os\nos.symlink('/.rlm-old-root/tmp', '/data/w')\n",
                      with_rw_bind(shared.path(), "/data"));
  ASSERT_EQ(plant.status, Status::ok) << describe(plant);
  shared.write("file", "x");
  for (const bool file : {false, true}) {
    HostTarget target;
    Policy policy = with_rw_bind(shared.path(), "/data");
    Mount mount;
    mount.target = "/data/w/" + target.name();
    if (file) {  // a file bind: its mount point is a file the plan creates
      mount.type = Mount::Type::bind;
      mount.source = shared.file("file");
    } else {
      mount.type = Mount::Type::tmpfs;
    }
    policy.filesystem.mounts.push_back(mount);
    auto result = run({"true"}, policy);
    EXPECT_FALSE(target.removed()) << (file ? "a file bind" : "a tmpfs") << " target created "
                                   << target.path() << " on the host";
    EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  }
}

TEST_F(NamespaceTest, BindSourceThroughALinkAnEarlierSandboxPlantedIsRefused) {
  SharedDir shared;
  auto plant =
      python("import os\nos.symlink('/etc', '/data/src')\n", with_rw_bind(shared.path(), "/data"));
  ASSERT_EQ(plant.status, Status::ok) << describe(plant);
  Policy policy = policy_;
  Mount mount;
  mount.source = shared.file("src");
  mount.target = "/leak";
  mount.type = Mount::Type::bind;
  policy.filesystem.mounts.push_back(mount);
  auto result = run({"ls", "/leak"}, policy);
  EXPECT_EQ(result.stdout_data.find("passwd"), std::string::npos)
      << "the host's /etc was bound into the sandbox: " << result.stdout_data;
  EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  EXPECT_NE(result.detail.find(".source"), std::string::npos) << result.detail;
}

}  // namespace
}  // namespace rlm::sectest
