// The server's clients are tenants who attack each other (issue 24; docs/security.md, "The
// server's tenants"): a client as another local uid (65534) tries to leave something behind that
// would reach another client's sandbox.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "rlm_sandbox/policy.hpp"
#include "server_fixture.hpp"

namespace rlm::test {
namespace {

// `rlm-sandbox ARGS...` as uid 65534; its exit code.
int cli_as_nobody(std::vector<std::string> args) {
  args.insert(args.begin(), bin_path("rlm-sandbox"));
  const pid_t pid = spawn(std::move(args), -1, -1, /*as_nobody=*/true);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Issue 24, line 1: a payload copied a binary into the client's read-write bind and made it
// set-uid; on the host it was the sandbox's slot uid's, so the client could run it as that uid and,
// once another client's sandbox got the same slot, reach into it. Now the set-id bits are refused,
// and what the payload writes is the client's own: the slot uid owns nothing that outlives it.
TEST(ServerTenant, ASandboxMakesNoSetIdFileAndWhatItWritesThroughABindIsTheClients) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);  // the client must reach the socket
  const std::string out = dir.file("out");
  ASSERT_EQ(mkdir(out.c_str(), 0700), 0);  // the client's own directory, nobody else's
  ASSERT_EQ(chown(out.c_str(), 65534, 65534), 0);
  const std::string roots = out + "/roots-file";  // a file of another uid in it
  {
    const int fd = open(roots.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "root's\n", 7), 7);
    close(fd);
  }
  ServerUnderTest server(dir, {"--pool", "default=1", "--socket-mode", "0666", "--allow-uid",
                               "65534", "--permit-bind", "65534:" + out + ":rw"});
  ASSERT_TRUE(server.ready()) << server.log();

  const std::string script =
      "cp /bin/sh /out/px; echo $? > /out/cp.rc; "
      "chmod 6755 /out/px 2>/dev/null; echo $? > /out/chmod.rc; "
      "chmod u+s /out/px 2>/dev/null; echo $? > /out/chmod-u.rc; "
      "chmod g+s /out 2>/dev/null; echo $? > /out/chmod-dir.rc; "
      "echo x >> /out/roots-file 2>/dev/null; echo $? > /out/roots.rc; "
      "ls -ln /out/px | cut -d' ' -f3 > /out/owner-inside";
  const int code = cli_as_nobody(
      {"run", "--server", server.socket(), "--bind", out + ":/out", "--", "/bin/sh", "-c", script});
  EXPECT_EQ(code, 0) << server.log();

  const auto read = [&](const std::string& name) {
    FILE* file = fopen((out + "/" + name).c_str(), "r");
    std::string text;
    if (!file) return std::string("(missing)");
    char buffer[256];
    for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
    fclose(file);
    return trimmed(text);
  };
  EXPECT_EQ(read("cp.rc"), "0") << "the sandbox could not write where its client can";
  EXPECT_EQ(read("chmod.rc"), "1");
  EXPECT_EQ(read("chmod-u.rc"), "1");
  EXPECT_EQ(read("chmod-dir.rc"), "1");
  EXPECT_NE(read("roots.rc"), "0") << "a file of another uid in the bind was writable";
  EXPECT_EQ(read("owner-inside"), "1000");  // inside, the sandbox user's
  struct stat st {};
  ASSERT_EQ(lstat((out + "/px").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u) << "the copy belongs to uid " << st.st_uid << ", not the client";
  EXPECT_EQ(st.st_gid, 65534u);
  EXPECT_EQ(st.st_mode & 06000, 0u) << "set-id bits on the host: " << std::oct << st.st_mode;
  ASSERT_EQ(lstat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 06000, 0u);
  EXPECT_EQ(read("roots-file"), "root's");
}

// A client's files must be its own: where the bind cannot be idmapped to it (here a ramfs below
// the directory, in the server's own mount namespace), nothing runs, and the client is told why
// and the fix before anything starts (issue 26, line 5).
TEST(ServerTenant, AClientsBindThatCannotBeIdmappedIsRefusedBeforeTheRunWithTheFix) {
  if (access("/usr/bin/unshare", X_OK) != 0)
    GTEST_SKIP() << "util-linux's unshare is not installed";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string out = dir.file("out");
  ASSERT_EQ(mkdir(out.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((out + "/ramfs").c_str(), 0755), 0);
  ASSERT_EQ(chown(out.c_str(), 65534, 65534), 0);
  ServerUnderTest server(
      dir,
      {"--pool", "default=0", "--socket-mode", "0666", "--allow-uid", "65534", "--permit-bind",
       "65534:" + out + ":rw"},
      {"/usr/bin/unshare", "--mount", "/bin/sh", "-c",
       "mount --make-rprivate / && mount -t ramfs none " + out + "/ramfs && exec \"$0\" \"$@\""});
  if (!server.ready())
    GTEST_SKIP() << "no mount namespace of its own for the server here: " << server.log();
  int err_pipe[2];
  ASSERT_EQ(pipe2(err_pipe, O_CLOEXEC), 0);
  const pid_t client = spawn({bin_path("rlm-sandbox"), "run", "--server", server.socket(), "--bind",
                              out + ":/out", "--", "sh", "-c", "echo x > /out/made"},
                             -1, err_pipe[1], /*as_nobody=*/true);
  close(err_pipe[1]);
  const std::string err = read_to_eof(err_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(client, &status, 0), client);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 125) << err;
  for (const std::string& words :
       {std::string("cannot be idmapped to its owner"),
        std::string("does not support idmapped mounts"),
        std::string("To fix: bind a directory on a filesystem that supports idmapped mounts")})
    EXPECT_NE(err.find(words), std::string::npos) << words << "\n" << err;
  EXPECT_NE(access((out + "/made").c_str(), F_OK), 0) << "the payload ran";
}

// A policy the server offers with a read-write bind has warm sandboxes built for the server's own
// uid (idmapped to root, the bind's directory marked). A client of another uid must not be served
// from them: its sandbox writes as the client, so it can write the client's own directory, and
// what it writes is the client's.
TEST(ServerTenant, AWarmSandboxBuiltForTheServerIsNotAnotherClientsWriter) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string out = dir.file("out");
  ASSERT_EQ(mkdir(out.c_str(), 0700), 0);
  ASSERT_EQ(chown(out.c_str(), 65534, 65534), 0);
  // The default policy with the bind added (a child policy's mounts replace its parent's).
  const std::string policy = dir.file("shared-out.json");
  {
    Policy offered = load_policy("default");
    Mount bind;
    bind.source = out;
    bind.target = "/out";
    bind.readonly = false;
    offered.filesystem.mounts.push_back(bind);
    FILE* file = fopen(policy.c_str(), "w");
    ASSERT_NE(file, nullptr);
    const std::string text = offered.to_json().dump();
    fwrite(text.data(), 1, text.size(), file);
    fclose(file);
  }
  ServerUnderTest server(
      dir, {"--pool", policy + "=2", "--socket-mode", "0666", "--allow-uid", "65534"});
  ASSERT_TRUE(server.ready()) << server.log();
  const int code = cli_as_nobody({"run", "--server", server.socket(), "--policy", policy, "--",
                                  "/bin/sh", "-c", "echo made > /out/warm"});
  EXPECT_EQ(code, 0) << server.log();
  struct stat st {};
  ASSERT_EQ(lstat((out + "/warm").c_str(), &st), 0) << "the client's sandbox could not write";
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_gid, 65534u);
}

}  // namespace
}  // namespace rlm::test
