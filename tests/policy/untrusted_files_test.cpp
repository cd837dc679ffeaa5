// Policy files from a repository are not trusted readers of host files: "extends" stays inside the
// policy's own directory, error messages never quote the bytes of a file, and binds of the
// kernel's interfaces (/proc, /sys, /dev) need a field that names the danger.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "policy_test_helpers.hpp"
#include "rlm_sandbox/policy.hpp"
#include "support/subprocess.hpp"

namespace rlm {
namespace {

using test::problems_in;
using test::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// A token no policy text or message could contain by chance.
std::string random_token() {
  std::random_device device;
  std::mt19937_64 generator(device());
  std::string token = "tok";
  for (int i = 0; i < 4; ++i) token += std::to_string(generator() % 1'000'000'000);
  return token;
}

// Everything a caller sees of a failed load: the exception's message and each diagnostic.
std::string everything_reported(std::string_view name_or_path) {
  try {
    load_policy(name_or_path);
    return "";
  } catch (const PolicyError& error) {
    std::string text = error.what();
    for (const auto& d : error.diagnostics()) text += "\n" + d.to_string();
    return text;
  }
}

// A policy directory and, next to it (outside it), a directory with a "secret" JSON file whose
// content a policy must not be able to reach.
struct RepoAndSecret {
  TempDir root;
  std::string token = random_token();
  std::string repo = root.file("repo");
  std::string secret_dir = root.file("secret");
  std::string secret = secret_dir + "/base.json";
  RepoAndSecret() {
    fs::create_directories(repo);
    fs::create_directories(secret_dir);
    root.write("secret/base.json", R"({"hostname": ")" + token + R"("})");
    ::chmod(secret.c_str(), 0600);
    ::chmod(secret_dir.c_str(), 0700);
  }
  std::string write_policy(const std::string& name, const std::string& text) const {
    root.write("repo/" + name, text);
    return repo + "/" + name;
  }
};

// `policy`, which extends `reference`, is refused for reaching outside its directory, and nothing
// reported about it quotes the secret.
void expect_refused_as_outside(const RepoAndSecret& files, const std::string& policy,
                               const std::string& reference) {
  const auto found = check_policy(policy);
  ASSERT_EQ(found.size(), 1u) << reference << ": " << everything_reported(policy);
  EXPECT_EQ(found[0].path, "extends");
  EXPECT_THAT(found[0].message, HasSubstr("outside the policy's directory")) << reference;
  EXPECT_THAT(everything_reported(policy), Not(HasSubstr(files.token))) << reference;
}

TEST(PolicyUntrustedExtends, AbsolutePathOutsideThePolicyDirectoryIsRefused) {
  RepoAndSecret files;
  const auto policy = files.write_policy("p.json", R"({"extends": ")" + files.secret + R"("})");
  const auto found = check_policy(policy);
  ASSERT_EQ(found.size(), 1u) << everything_reported(policy);
  EXPECT_EQ(found[0].path, "extends");
  EXPECT_THAT(found[0].message, HasSubstr(files.secret));
  EXPECT_THAT(found[0].message, HasSubstr("outside the policy's directory"));
  EXPECT_THAT(everything_reported(policy), Not(HasSubstr(files.token)));

  const auto shadow = files.write_policy("shadow.json", R"({"extends": "/etc/shadow"})");
  EXPECT_THAT(check_policy(shadow).at(0).message, HasSubstr("outside the policy's directory"));
  // Through load_policy_text too: its base_dir is the directory.
  EXPECT_THAT(problems_in(R"({"extends": ")" + files.secret + R"("})", files.repo).at(0).message,
              HasSubstr("outside the policy's directory"));
}

TEST(PolicyUntrustedExtends, DotDotOutOfThePolicyDirectoryIsRefused) {
  RepoAndSecret files;
  for (const std::string reference :
       {"../secret/base.json", "./../secret/base.json", "sub/../../secret/base.json", ".."}) {
    fs::create_directories(files.repo + "/sub");
    const auto policy = files.write_policy("p.json", R"({"extends": ")" + reference + R"("})");
    ASSERT_NO_FATAL_FAILURE(expect_refused_as_outside(files, policy, reference));
  }
  // A nested policy is confined to its own directory, not to the top one's.
  files.write_policy("sub/mid.json", R"({"extends": "../base.json"})");
  files.write_policy("base.json", R"({"hostname": "inside"})");
  const auto top = files.write_policy("top.json", R"({"extends": "sub/mid.json"})");
  EXPECT_THAT(check_policy(top).at(0).message, HasSubstr("outside the policy's directory"));
}

TEST(PolicyUntrustedExtends, SymlinkLeadingOutOfThePolicyDirectoryIsRefused) {
  RepoAndSecret files;
  fs::create_symlink(files.secret, files.repo + "/absolute.json");
  fs::create_symlink("../secret/base.json", files.repo + "/relative.json");
  fs::create_directories(files.repo + "/sub");
  fs::create_directory_symlink(files.secret_dir, files.repo + "/linked-dir");
  fs::create_symlink(files.secret, files.repo + "/strict");  // a name that is also a file here
  for (const std::string reference :
       {"absolute.json", "./relative.json", "linked-dir/base.json", "strict"}) {
    const auto policy = files.write_policy("p.json", R"({"extends": ")" + reference + R"("})");
    ASSERT_NO_FATAL_FAILURE(expect_refused_as_outside(files, policy, reference));
    // policy show's path: the merged policy never carries the secret's field.
    EXPECT_THROW(load_policy(policy), PolicyError) << reference;
  }
}

TEST(PolicyUntrustedExtends, PathsInsideThePolicyDirectoryStillWork) {
  RepoAndSecret files;
  fs::create_directories(files.repo + "/sub/deeper");
  files.write_policy("sub/deeper/root.json", R"({"extends": "default", "hostname": "root-host"})");
  files.write_policy("sub/base.json", R"({"extends": "deeper/../deeper/root.json"})");
  fs::create_symlink("base.json", files.repo + "/sub/link.json");  // a link that stays inside
  const auto absolute =
      files.write_policy("absolute.json", R"({"extends": ")" + files.repo + R"(/sub/link.json"})");
  EXPECT_EQ(load_policy(absolute).hostname, "root-host");
  const auto relative = files.write_policy("relative.json", R"({"extends": "./sub/base.json"})");
  EXPECT_EQ(load_policy(relative).hostname, "root-host");
  EXPECT_EQ(load_policy_text(R"({"extends": "sub/base.json"})", "inline", files.repo).hostname,
            "root-host");
}

TEST(PolicyUntrustedExtends, ABaseThatIsNotARegularFileIsRefusedWithoutWaiting) {
  RepoAndSecret files;
  ASSERT_EQ(::mkfifo((files.repo + "/fifo.json").c_str(), 0600), 0);
  const auto policy = files.write_policy("p.json", R"({"extends": "fifo.json"})");
  // Opening a FIFO for reading waits for a writer; the check runs in a child with an alarm so a
  // regression fails this test instead of hanging it.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);
    const auto found = check_policy(policy);
    const bool refused = found.size() == 1 && found[0].path == "extends" &&
                         found[0].message.find("not a regular file") != std::string::npos;
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(WIFSIGNALED(status)) << "the check waited on the FIFO until the alarm";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "refused with a message saying it is not a regular file";
}

// Text planted in a file that is not a policy must never come back in a message.
TEST(PolicyUntrustedContents, ErrorsNeverQuoteTheBytesOfAFile) {
  TempDir dir;
  const std::string token = random_token();
  const std::vector<std::string> documents = {
      "root:" + token + ":19000:0:99999:7:::\n",          // /etc/shadow-like: an invalid literal
      "{\"a\": " + token + "}",                           // a bare word where a value belongs
      "{\"a\": \"" + token + "\n\"}",                     // a control character inside a string
      "{\"a\": \"" + token,                               // an unterminated string
      "{\"a\": 1" + token + "}",                          // a number running into a word
      "{\"a\": 9" + std::string(400, '9') + token + "}",  // a number that overflows
      "{\"a\": 1e99999" + token + "}",
      "\"" + token + "\"",  // a document that is a string, not an object
      "[\"" + token + "\"]",
      token + "\x01\x02",
      "\xef\xbb\xbf" + token,  // a byte-order mark then garbage
  };
  for (std::size_t i = 0; i < documents.size(); ++i) {
    const std::string name = "doc" + std::to_string(i);
    dir.write(name, documents[i]);
    const auto as_top = everything_reported(dir.file(name));
    EXPECT_THAT(as_top, HasSubstr(dir.file(name))) << "names the file: " << i;
    EXPECT_THAT(as_top, Not(HasSubstr(token))) << i << ": " << documents[i];
    dir.write("top.json", R"({"extends": ")" + name + R"("})");
    const auto as_base = everything_reported(dir.file("top.json"));
    EXPECT_THAT(as_base, HasSubstr("in " + dir.file(name))) << i;
    EXPECT_THAT(as_base, Not(HasSubstr(token))) << i << ": " << documents[i];
    try {
      load_policy_text(documents[i], "inline");
      ADD_FAILURE() << "loaded " << documents[i];
    } catch (const PolicyError& error) {
      EXPECT_THAT(error.what(), Not(HasSubstr(token))) << i;
    }
  }
}

TEST(PolicyUntrustedContents, SyntaxErrorsStillSayWhereAndWhat) {
  EXPECT_EQ(test::only_problem_in("{\"a\": nope}").message,
            "malformed JSON at line 1, column 8: invalid literal");
  EXPECT_EQ(test::only_problem_in("\"text\"").message,
            "a policy must be a JSON object, got a string");
  EXPECT_EQ(test::only_problem_in(R"({"limits": {"pids": 1e400}})").message,
            "malformed JSON: number overflow");
}

// Found by policy_load_fuzz: a long wrong value was cut for its message in the middle of a UTF-8
// character, and the message then could not be put in JSON (the CLI's --json, the repl).
TEST(PolicyUntrustedContents, ShortenedValuesInMessagesStayValidUtf8) {
  std::string accents;
  for (int i = 0; i < 30; ++i) accents += "\u00e9";  // two bytes each in UTF-8
  for (const std::string prefix : {"", "a"}) {
    const auto found = problems_in(R"({"namespaces": {"user": ")" + prefix + accents + "\"}}");
    ASSERT_EQ(found.size(), 1u);
    EXPECT_THAT(found[0].message, HasSubstr("got a string"));
    EXPECT_THAT(found[0].message, HasSubstr("...")) << "shortened";
    EXPECT_NO_THROW((void)nlohmann::json(found[0].message).dump()) << prefix;
  }
}

// A hostile policy of long unknown names (syscalls, keys) is reported without a suggestion and
// without computing an edit distance against every candidate for each one. A behavioural bound,
// not a speed test: before, this document took about 20 s of CPU to check; a CPU second is far
// more than checking it needs.
TEST(PolicyUntrustedContents, LongUnknownNamesCostNoSuggestionSearch) {
  std::string names, keys;
  for (int i = 0; i < 190; ++i) {
    names += std::string(i ? ", " : "") + "\"" + std::string(5000, 'x') + std::to_string(i) + "\"";
    keys +=
        std::string(i ? ", " : "") + "\"" + std::string(5000, 'k') + std::to_string(i) + "\": 1";
  }
  timespec start{}, end{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
  const auto unknown_syscalls = problems_in(R"({"seccomp": {"syscalls": [{"names": [)" + names +
                                            R"(], "action": "SCMP_ACT_ERRNO"}]}})");
  const auto unknown_keys = problems_in("{" + keys + "}");
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &end);
  const double seconds =
      static_cast<double>(end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
  ASSERT_EQ(unknown_syscalls.size(), 190u);
  EXPECT_THAT(unknown_syscalls[0].message, HasSubstr("unknown syscall"));
  EXPECT_THAT(unknown_syscalls[0].message, Not(HasSubstr("did you mean")));
  ASSERT_EQ(unknown_keys.size(), 190u);
  EXPECT_THAT(unknown_keys[0].message, HasSubstr("unknown key; expected one of"));
  EXPECT_LT(seconds, 1.0) << "CPU seconds to check two 1 MB documents of unknown names";
}

// ---- Binds of the kernel's interfaces --------------------------------------------------------

std::string bind_policy(const std::string& source, const std::string& extra = "") {
  return R"({"filesystem": {"mounts": [{"source": ")" + source + R"(", "target": "/mnt/x"}])" +
         extra + "}}";
}

TEST(PolicyKernelInterfaceBinds, RefusedWithoutTheField) {
  TempDir dir;
  fs::create_symlink("/proc/self", dir.file("proc-link"));
  fs::create_symlink("/sys/kernel", dir.file("sys-link"));
  for (const std::string& source : std::vector<std::string>{
           "/proc", "/proc/self/root", "/proc/sys/kernel", "/sys", "/sys/fs/cgroup", "/dev",
           "/dev/kmsg", "/dev/shm", "/", "/usr/../proc/1", "/proc/", dir.file("proc-link"),
           dir.file("sys-link")}) {
    const auto found = problems_in(bind_policy(source));
    ASSERT_EQ(found.size(), 1u) << source;
    EXPECT_EQ(found[0].path, "filesystem.mounts[0].source") << source;
    EXPECT_THAT(found[0].message, HasSubstr("filesystem.allow_kernel_interface_binds")) << source;
    EXPECT_TRUE(
        problems_in(bind_policy(source, R"(, "allow_kernel_interface_binds": true)")).empty())
        << source;
  }
  // Ordinary sources are unaffected, and so are names that only start like one.
  for (const std::string& source :
       std::vector<std::string>{"/usr", "/etc/ssl/certs", "/procx", "/device", dir.path()})
    EXPECT_TRUE(problems_in(bind_policy(source)).empty()) << source;
  // A tmpfs on a target under /dev is not a bind of the host's /dev.
  EXPECT_TRUE(
      problems_in(R"({"filesystem": {"mounts": [{"type": "tmpfs", "target": "/dev"}]}})").empty());
}

TEST(PolicyKernelInterfaceBinds, AProcfsMountedElsewhereIsRefusedToo) {
  TempDir dir;
  fs::create_directories(dir.file("proc"));
  // In a mount namespace of its own, so the host's mount table never changes.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr))
      ::_exit(2);
    if (::mount("proc", dir.file("proc").c_str(), "proc", 0, nullptr) != 0) ::_exit(3);
    const auto found = problems_in(bind_policy(dir.file("proc/self")));
    const auto above = problems_in(bind_policy(dir.path()));  // holds a procfs below it
    const bool refused =
        found.size() == 1 &&
        found[0].message.find("allow_kernel_interface_binds") != std::string::npos &&
        above.size() == 1;
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2, 3: could not set up the mount; 1: not refused";
}

TEST(PolicyKernelInterfaceBinds, TheFieldIsValidatedShownAndRoundTrips) {
  const auto wrong = problems_in(R"({"filesystem": {"allow_kernel_interface_binds": "yes"}})");
  ASSERT_EQ(wrong.size(), 1u);
  EXPECT_EQ(wrong[0].to_string(),
            "filesystem.allow_kernel_interface_binds: expected true or false, got a string "
            "(\"yes\")");
  EXPECT_FALSE(load_policy("default").filesystem.allow_kernel_interface_binds);
  EXPECT_EQ(load_policy("default").to_json()["filesystem"]["allow_kernel_interface_binds"], false);
  const Policy allowed =
      load_policy_text(bind_policy("/dev/null", R"(, "allow_kernel_interface_binds": true)"), "p");
  EXPECT_TRUE(allowed.filesystem.allow_kernel_interface_binds);
  const auto shown = allowed.to_json();
  EXPECT_EQ(shown["filesystem"]["allow_kernel_interface_binds"], true);
  EXPECT_TRUE(policy_from_json(shown, "again").filesystem.allow_kernel_interface_binds);
  // Merged like any other key: a policy extending one that allows it inherits the allowance.
  TempDir dir;
  dir.write("base.json", bind_policy("/dev/null", R"(, "allow_kernel_interface_binds": true)"));
  dir.write("top.json", R"({"extends": "base.json", "hostname": "h"})");
  EXPECT_TRUE(load_policy(dir.file("top.json")).filesystem.allow_kernel_interface_binds);
}

}  // namespace
}  // namespace rlm
