// The compiled-filter cache (runtime/seccomp/cache.hpp): a policy gets exactly the programs its own
// rules compile to, whether they come from libseccomp, from memory or from the disk; a file in the
// cache directory that is not ours, is writable by others or names other rules is never used.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "seccomp/cache.hpp"
#include "seccomp/seccomp.hpp"

namespace rlm {
namespace {

namespace cache = seccomp::cache;

SeccompRule rule(std::vector<std::string> names, std::string action,
                 std::optional<int> errno_ret = std::nullopt, std::vector<SeccompArg> args = {}) {
  return {std::move(names), std::move(action), errno_ret, std::move(args)};
}

Seccomp rules(std::string default_action, std::vector<SeccompRule> syscalls = {}) {
  Seccomp s;
  s.default_action = std::move(default_action);
  s.syscalls = std::move(syscalls);
  return s;
}

// Policies that differ from each other in one field each.
std::vector<Seccomp> neighbours() {
  const SeccompArg fionread{1, 0x541B, 0, "SCMP_CMP_EQ"};
  return {
      rules("SCMP_ACT_ALLOW"),
      rules("SCMP_ACT_LOG"),
      rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO")}),
      rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 1)}),
      rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 13)}),
      rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_KILL_PROCESS")}),
      rules("SCMP_ACT_ALLOW", {rule({"getpid"}, "SCMP_ACT_ERRNO", 13)}),
      rules("SCMP_ACT_ALLOW", {rule({"uname", "getpid"}, "SCMP_ACT_ERRNO", 13)}),
      rules("SCMP_ACT_ALLOW", {rule({"ioctl"}, "SCMP_ACT_ERRNO", 1, {fionread})}),
      rules("SCMP_ACT_ALLOW",
            {rule({"ioctl"}, "SCMP_ACT_ERRNO", 1, {{1, 0x541C, 0, "SCMP_CMP_EQ"}})}),
      rules("SCMP_ACT_ALLOW",
            {rule({"ioctl"}, "SCMP_ACT_ERRNO", 1, {{1, 0x541B, 0, "SCMP_CMP_GE"}})}),
  };
}

std::vector<sock_filter> read_all(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  std::vector<sock_filter> out(static_cast<std::size_t>(st.st_size) / sizeof(sock_filter));
  EXPECT_EQ(::pread(fd, out.data(), static_cast<std::size_t>(st.st_size), 0), st.st_size);
  return out;
}

bool same(const std::vector<sock_filter>& a, const std::vector<sock_filter>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](const sock_filter& x, const sock_filter& y) {
           return x.code == y.code && x.jt == y.jt && x.jf == y.jf && x.k == y.k;
         });
}

// What the policy's own rules compile to, uncached: the kill program and the notify program.
struct Expected {
  std::vector<sock_filter> kill, notify;
};
Expected uncached(const Seccomp& policy) {
  Expected e;
  e.kill = seccomp::compile(policy).instructions;
  auto notify = seccomp::compile(policy, {.kill_as_notify = true});
  if (notify.notifies) e.notify = notify.instructions;
  return e;
}

void expect_own_programs(const Seccomp& policy, const std::string& what) {
  const auto filter = seccomp::prepare_payload_filter(policy);
  const auto expected = uncached(policy);
  EXPECT_TRUE(same(read_all(filter.kill.get()), expected.kill)) << what;
  if (expected.notify.empty()) {
    EXPECT_FALSE(filter.notify) << what;
  } else {
    ASSERT_TRUE(filter.notify) << what;
    EXPECT_TRUE(same(read_all(filter.notify.get()), expected.notify)) << what;
  }
  // Every run gets a sealed memfd of its own: nothing can write the program init will read.
  EXPECT_EQ(::fcntl(filter.kill.get(), F_GET_SEALS),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)
      << what;
}

class SeccompCache : public ::testing::Test {
 protected:
  void SetUp() override {
    cache::set_disk_directory("");
    cache::clear_memory();
  }
  void TearDown() override {
    cache::set_disk_directory("");
    cache::clear_memory();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // A fresh cache directory as the real one is made: ours, 0700.
  std::string make_dir() {
    char path[] = "/tmp/rlm-seccomp-cache-test-XXXXXX";
    EXPECT_NE(::mkdtemp(path), nullptr);
    dir_ = path;
    EXPECT_EQ(::chmod(path, 0700), 0);
    return dir_ + "/cache";
  }
  // A fresh disk cache holding `policy`'s programs; returns the file they are in.
  std::string disk_cache_with(const Seccomp& policy) {
    cache_dir_ = make_dir();
    cache::set_disk_directory(cache_dir_);
    expect_own_programs(policy, "compiled");
    return cache_dir_ + "/" + cache::disk_file_name(cache::program_key(policy));
  }
  std::string dir_, cache_dir_;
};

TEST_F(SeccompCache, KeysOfDifferentRulesDifferAndOfEqualRulesAgree) {
  const auto all = neighbours();
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(cache::program_key(all[i]), cache::program_key(neighbours()[i]));
    for (std::size_t j = i + 1; j < all.size(); ++j)
      EXPECT_NE(cache::program_key(all[i]), cache::program_key(all[j])) << i << " vs " << j;
  }
  // Field boundaries are part of the key: names cannot run into each other.
  EXPECT_NE(cache::program_key(rules("SCMP_ACT_ALLOW", {rule({"ab", "c"}, "SCMP_ACT_ERRNO")})),
            cache::program_key(rules("SCMP_ACT_ALLOW", {rule({"a", "bc"}, "SCMP_ACT_ERRNO")})));
}

TEST_F(SeccompCache, ARepeatedPolicyIsServedFromMemoryWithItsOwnProgram) {
  const auto policy = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_KILL_PROCESS")});
  const auto before = cache::stats();
  expect_own_programs(policy, "first");
  EXPECT_EQ(cache::stats().misses, before.misses + 1);
  expect_own_programs(policy, "second");
  expect_own_programs(policy, "third");
  EXPECT_EQ(cache::stats().memory_hits, before.memory_hits + 2);
  EXPECT_EQ(cache::stats().misses, before.misses + 1);
}

// check() (policy validation) answers from the cache: only rules that layered without a problem
// were ever compiled and stored, so a stored program means nothing to report, and the layering is
// spared. Shown with a program stored by hand for rules that do have a problem: check() takes the
// cache's word (the cache is trusted this far already: its program is what the payload runs
// under), and without the entry it reports the problem.
TEST_F(SeccompCache, CheckTakesAStoredProgramAsRulesThatLayered) {
  const auto broken = rules("SCMP_ACT_ALLOW", {rule({"no_such_syscall"}, "SCMP_ACT_ERRNO")});
  ASSERT_FALSE(seccomp::check(broken).empty()) << "the control: these rules have a problem";
  const auto fine = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO")});
  expect_own_programs(fine, "compiled");
  const auto stored = cache::find(cache::program_key(fine));
  ASSERT_TRUE(stored.has_value());

  cache::store(cache::program_key(broken), *stored);
  const auto before = cache::stats();
  EXPECT_TRUE(seccomp::check(broken).empty());
  EXPECT_EQ(cache::stats().memory_hits, before.memory_hits + 1);
  cache::clear_memory();
  EXPECT_FALSE(seccomp::check(broken).empty());
}

TEST_F(SeccompCache, DifferentPoliciesNeverGetAnothersProgram) {
  const auto all = neighbours();
  // Twice round, so the second round is served from the cache, interleaved.
  for (int round = 0; round < 2; ++round)
    for (std::size_t i = 0; i < all.size(); ++i)
      expect_own_programs(all[i],
                          "policy " + std::to_string(i) + ", round " + std::to_string(round));
}

TEST_F(SeccompCache, TheDiskLayerServesTheNextProcessTheSameProgram) {
  const auto policy = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 13)});
  const auto file = disk_cache_with(policy);
  struct stat st {};
  ASSERT_EQ(::stat(cache_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(file.c_str(), &st), 0) << "no cache file written";
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  cache::clear_memory();  // as a new process would start
  const auto before = cache::stats();
  expect_own_programs(policy, "from disk");
  EXPECT_EQ(cache::stats().disk_hits, before.disk_hits + 1);
  EXPECT_EQ(cache::stats().misses, before.misses);
}

// Every rebuild of the executable is a new key, so a cache that only ever fills would, after
// kDiskEntries builds, compile every run again (it did, on a developer's machine: +1.6 ms a run).
TEST_F(SeccompCache, AFullDirectoryLosesItsOldestFilesAndKeepsServing) {
  cache_dir_ = make_dir();
  ASSERT_EQ(::mkdir(cache_dir_.c_str(), 0700), 0);
  const auto set_age = [](const std::string& path, long seconds_ago) {
    const timespec when{::time(nullptr) - seconds_ago, 0};
    const timespec times[2] = {when, when};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
  };
  // The directory full of an older build's programs, the very oldest named first.
  for (std::size_t i = 0; i < cache::kDiskEntries; ++i) {
    const auto path = cache_dir_ + "/old-" + std::to_string(i) + ".bpf";
    std::ofstream(path) << "an older build's program";
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    set_age(path, 3600 - static_cast<long>(i));
  }
  // A writer that died a while ago left its temporary file; one writing now has its own.
  std::ofstream(cache_dir_ + "/.dead.bpf.1.0") << "x";
  set_age(cache_dir_ + "/.dead.bpf.1.0", 600);
  std::ofstream(cache_dir_ + "/.busy.bpf.2.0") << "x";

  cache::set_disk_directory(cache_dir_);
  const auto policy = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 13)});
  expect_own_programs(policy, "compiled");
  const auto file = cache_dir_ + "/" + cache::disk_file_name(cache::program_key(policy));
  EXPECT_TRUE(std::filesystem::exists(file)) << "nothing written to a full directory";
  EXPECT_FALSE(std::filesystem::exists(cache_dir_ + "/old-0.bpf")) << "the oldest file was kept";
  EXPECT_TRUE(std::filesystem::exists(cache_dir_ + "/old-1.bpf")) << "more than needed was removed";
  EXPECT_FALSE(std::filesystem::exists(cache_dir_ + "/.dead.bpf.1.0"));
  EXPECT_TRUE(std::filesystem::exists(cache_dir_ + "/.busy.bpf.2.0"));
  std::size_t programs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir_))
    if (entry.path().filename().string().front() != '.') ++programs;
  EXPECT_EQ(programs, cache::kDiskEntries);

  cache::clear_memory();  // the next process
  const auto before = cache::stats();
  expect_own_programs(policy, "from disk");
  EXPECT_EQ(cache::stats().disk_hits, before.disk_hits + 1);
}

TEST_F(SeccompCache, FilesNotOursOrWritableByOthersOrForOtherRulesAreNeverUsed) {
  const std::string dir = make_dir();
  cache::set_disk_directory(dir);
  const auto a = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 13)});
  const auto b = rules("SCMP_ACT_ALLOW", {rule({"getpid"}, "SCMP_ACT_ERRNO", 13)});
  expect_own_programs(a, "a");
  const auto file_a = dir + "/" + cache::disk_file_name(cache::program_key(a));
  const auto file_b = dir + "/" + cache::disk_file_name(cache::program_key(b));

  // A's file put where B's would be: it names A's rules, so B never takes it.
  std::filesystem::copy_file(file_a, file_b);
  cache::clear_memory();
  auto before = cache::stats();
  expect_own_programs(b, "b beside a's file under b's name");
  EXPECT_EQ(cache::stats().disk_rejected, before.disk_rejected + 1);
  EXPECT_EQ(cache::stats().disk_hits, before.disk_hits);

  // Writable by others: not trusted.
  ASSERT_EQ(::chmod(file_a.c_str(), 0666), 0);
  cache::clear_memory();
  before = cache::stats();
  expect_own_programs(a, "a group/other-writable");
  EXPECT_EQ(cache::stats().disk_rejected, before.disk_rejected + 1);
  EXPECT_EQ(cache::stats().disk_hits, before.disk_hits);

  // Owned by someone else: not trusted.
  ASSERT_EQ(::chmod(file_a.c_str(), 0600), 0);
  ASSERT_EQ(::chown(file_a.c_str(), 65534, 65534), 0);
  cache::clear_memory();
  before = cache::stats();
  expect_own_programs(a, "a owned by nobody");
  EXPECT_EQ(cache::stats().disk_rejected, before.disk_rejected + 1);

  // A directory others may enter is not used at all, not even written.
  std::filesystem::remove(file_a);
  std::filesystem::remove(file_b);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  cache::clear_memory();
  before = cache::stats();
  expect_own_programs(a, "a, open directory");
  EXPECT_FALSE(std::filesystem::exists(file_a));
  cache::clear_memory();
  expect_own_programs(a, "a, open directory again");
  EXPECT_EQ(cache::stats().disk_hits, before.disk_hits);
  EXPECT_EQ(cache::stats().misses, before.misses + 2);
}

TEST_F(SeccompCache, ATruncatedOrAlteredFileIsNeverUsed) {
  const auto policy = rules("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", 13)});
  const auto file = disk_cache_with(policy);
  const auto size = std::filesystem::file_size(file);

  std::filesystem::resize_file(file, size - 3);  // cut inside the program
  cache::clear_memory();
  auto before = cache::stats();
  expect_own_programs(policy, "truncated");
  EXPECT_EQ(cache::stats().disk_rejected, before.disk_rejected + 1);

  {  // a trailing byte: not the format
    std::ofstream out(file, std::ios::binary | std::ios::app);
    out << 'x';
  }
  cache::clear_memory();
  before = cache::stats();
  expect_own_programs(policy, "trailing byte");
  EXPECT_EQ(cache::stats().disk_rejected, before.disk_rejected + 1);
}

}  // namespace
}  // namespace rlm
