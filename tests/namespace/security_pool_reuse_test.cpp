// Nothing of one run reaches the next. Through the server (RLM_SECURITY_BACKEND=server) the runs
// come from a pool of sandboxes built ahead of time, so each run below meets a sandbox that was
// waiting while the run before it did its worst; directly, each is built cold. Either way the
// next run must see none of it.
#include <thread>

#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

// Leaves everything it can behind: a file in /tmp, a detached process whose command line holds
// the token, its own environment variable (given by the request), and a pids limit below the
// policy's (the request's tightened policy, written to the run's cgroup), which it proves is in
// force by forking until the limit stops it, printing (flushed) as it goes: the runtime stops a
// sandbox that has hit its process limit within milliseconds, which on a slow machine (the VM lane)
// can come before any line printed after the loop (so the run always ends pids_limit). Where an
// rlimit stands in for the cgroup (a container without a writable one) the refused fork is the
// proof, and the script ends at once with code 3.
std::string leaving_script(const std::string& token) {
  return "import os, subprocess, time\n"
         "open('/tmp/leak-" +
         token +
         "', 'w').write('x')\n"
         "subprocess.Popen(['sh', '-c', 'while :; do sleep 1; done', 'leak-" +
         token +
         "'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
         "print('env', os.environ.get('RLM_LEAK', ''), flush=True)\n"
         "forked = 0\n"
         "print('forked', forked, flush=True)\n"
         "try:\n"
         "    for _ in range(20):\n"
         "        if os.fork() == 0:\n"
         "            time.sleep(2)\n"
         "            os._exit(0)\n"
         "        forked += 1\n"
         "        print('forked', forked, flush=True)\n"
         "except OSError:\n"
         "    os._exit(3)\n"
         "time.sleep(30)\n";  // the runtime stops it at the limit it hit (wall time: 10 s)
}

// Looks for each of them. The token is spelled backwards in the script, so this process's own
// command line does not hold it.
std::string looking_script(const std::string& token) {
  return "import os, time\n"
         "t = '" +
         std::string(token.rbegin(), token.rend()) +
         "'[::-1]\n"
         "print('file', os.path.exists('/tmp/leak-' + t))\n"
         "env = dict(os.environ)\n"
         "print('env', 'RLM_LEAK' in env or t in ''.join(env.values()))\n"
         "procs = 0\n"
         "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
         "    try:\n"
         "        procs += t in open('/proc/%s/cmdline' % pid, 'rb').read().decode('utf-8', "
         "'replace')\n"
         "    except OSError:\n"
         "        pass\n"
         "print('procs', procs)\n"
         "forked = 0\n"
         "try:\n"
         "    for _ in range(20):\n"
         "        if os.fork() == 0:\n"
         "            time.sleep(1)\n"
         "            os._exit(0)\n"
         "        forked += 1\n"
         "except OSError:\n"
         "    pass\n"
         "print('forked', forked)\n";
}

TEST_F(NamespaceTest, NothingOfOneRunReachesTheNext) {
  Policy tight = policy_;
  tight.limits.pids = 8;
  // More rounds than the server's pool holds, so sandboxes built during earlier rounds (refills)
  // are checked too.
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string token = random_token();
    Request leave;
    leave.code = leaving_script(token);
    leave.language = "python";
    leave.env = {{"RLM_LEAK", token}};
    const Result first = run_request(leave, tight);
    // Hitting the limit is how the run ends: the limit was in force.
    ASSERT_EQ(first.status,
              process_limit_stops_the_run() ? Status::pids_limit : Status::exit_nonzero)
        << describe(first);
    auto left = parse_lines(first.stdout_data);
    EXPECT_EQ(left["env"], token) << "the request's environment did not reach run 1";
    ASSERT_FALSE(left["forked"].empty()) << first.stdout_data;
    EXPECT_LT(std::stoi(left["forked"]), 8) << "run 1's pids limit (8) was not in force";

    // The detached process is gone with its sandbox.
    for (int i = 0; i < 100 && !processes_with_token(token).empty(); ++i)
      std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(processes_with_token(token).empty()) << "run 1's process outlived it on the host";

    const Result next = python(looking_script(token));
    ASSERT_EQ(next.status, Status::ok) << describe(next);
    auto seen = parse_lines(next.stdout_data);
    EXPECT_EQ(seen["file"], "False") << "run 1's /tmp file is in the next run's /tmp";
    EXPECT_EQ(seen["env"], "False") << "run 1's environment reached the next run";
    EXPECT_EQ(seen["procs"], "0") << "run 1's process is visible to the next run";
    EXPECT_EQ(seen["forked"], "20") << "run 1's pids limit (8) holds in the next run, whose "
                                       "policy allows 64";
  }
}

}  // namespace
}  // namespace rlm::sectest
