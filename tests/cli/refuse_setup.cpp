// A static helper for the probe tests: installs a seccomp filter that refuses one step of the
// namespace backend's setup the way a container's default profile does, then execs a command
// (the rlm-sandbox CLI) under it -- real kernel refusals, no mocks.
//   refuse_setup userns      clone/unshare with CLONE_NEWUSER: EPERM; clone3: ENOSYS (Docker's)
//   refuse_setup pivot_root  pivot_root: EPERM (Docker's and containerd's default profiles)
//   ... -- CMD [ARGS...]
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc < 4 || std::strcmp(argv[2], "--") != 0) {
    std::fprintf(stderr, "usage: refuse_setup userns|pivot_root -- CMD [ARGS...]\n");
    return 2;
  }
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (!filter) return 3;
  int rc = 0;
  if (std::strcmp(argv[1], "userns") == 0) {
    rc |= seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    rc |= seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    rc |= seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  } else if (std::strcmp(argv[1], "pivot_root") == 0) {
    rc |= seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(pivot_root), 0);
  } else {
    std::fprintf(stderr, "refuse_setup: unknown step %s\n", argv[1]);
    return 2;
  }
  if (rc != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || seccomp_load(filter) != 0) {
    std::perror("refuse_setup: installing the filter");
    return 3;
  }
  seccomp_release(filter);
  execv(argv[3], argv + 3);
  std::perror("refuse_setup: execv");
  return 127;
}
