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

}  // namespace
}  // namespace rlm::test
