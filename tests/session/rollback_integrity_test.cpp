// Rollback integrity (issue 11, line 5): a cell attacks, from inside a real namespace session, the
// processes that hold the state it must not change -- its checkpoint (its parent), the snapshots,
// the worker's root, init -- by /proc/PID/mem and environ, by every signal-sending call, through
// process groups, SIGIO ownership and prlimit. Each attempt must fail with EPERM/EACCES, and the
// session must go on and roll back to exactly the state before the cell.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "namespace_session_fixture.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;

std::string dump(const CellResult& cell) {
  return cell.to_json().dump();
}

// Python run at the start of an attacking cell: `older` lists every process that existed before
// the cell (init, the worker's root, the checkpoint, snapshots), and `attempt(name, call)` records
// how each call ended: "EPERM", "EACCES", or what else happened.
constexpr const char* kAttackPrelude = R"(import ctypes, errno, os, signal
me = os.getpid()
older = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != me)
outcomes = {}
def attempt(name, call):
    try:
        call()
        outcomes[name] = 'allowed'
    except OSError as e:
        outcomes[name] = errno.errorcode.get(e.errno, str(e.errno))
def unexpected():
    return {k: v for k, v in outcomes.items() if v not in ('EPERM', 'EACCES')}
)";

class RollbackIntegrity : public NamespaceSessionTest {
 protected:
  void SetUp() override {
    NamespaceSessionTest::SetUp();
    session_ = open();
  }

  CellResult run(const std::string& code, std::optional<std::chrono::milliseconds> timeout = {}) {
    return session_->execute(code, timeout);
  }

  // After an attack: the session still runs cells, a timeout still rolls back to the state
  // before it, and `kept` still holds `expected`.
  void expect_session_intact(const std::string& expected) {
    auto check = run("print(kept)");
    ASSERT_EQ(check.status, CellStatus::ok) << dump(check);
    EXPECT_EQ(check.stdout_data, expected + "\n");
    auto spin = run("kept = 'changed'\nwhile True: pass", 1000ms);
    EXPECT_EQ(spin.status, CellStatus::timeout) << dump(spin);
    EXPECT_TRUE(spin.rolled_back);
    EXPECT_EQ(run("print(kept)").stdout_data, expected + "\n");
  }

  std::unique_ptr<Session> session_;
};

// The attack from the issue: write into the frozen checkpoint's memory, then time out. The next
// cell must see the state from before.
TEST_F(RollbackIntegrity, ACellCannotWriteIntoItsCheckpointThroughProcMem) {
  ASSERT_EQ(run("import ctypes\nkept = bytearray(b'before')\n"
                "address = ctypes.addressof((ctypes.c_char * 6).from_buffer(kept))")
                .status,
            CellStatus::ok);
  auto attack = run(std::string(kAttackPrelude) +
                        R"py(def write():
    with open('/proc/%d/mem' % os.getppid(), 'r+b', buffering=0) as mem:
        mem.seek(address)
        mem.write(b'AFTER!')
attempt('write', write)
print(outcomes, flush=True)
while True: pass)py",
                    1000ms);
  EXPECT_EQ(attack.status, CellStatus::timeout) << dump(attack);
  EXPECT_TRUE(attack.rolled_back);
  auto after = run("print(kept.decode())");
  EXPECT_EQ(after.stdout_data, "before\n") << "the rollback kept the cell's tampering";
}

TEST_F(RollbackIntegrity, ACellCannotReadItsCheckpointOrTheWorkerRoot) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  auto attack = run(std::string(kAttackPrelude) +
                    R"py(root = llm_query.__globals__['ROOT_PID']
def read(path):
    with open(path, 'rb') as f:
        f.read(1)
for pid in (os.getppid(), root):
    for what in ('mem', 'environ', 'auxv'):
        attempt('%s of %d' % (what, pid),
                lambda: read('/proc/%d/%s' % (pid, what)))
    attempt('fd of %d' % pid, lambda: os.listdir('/proc/%d/fd' % pid))
    attempt('oom_score_adj of %d' % pid,
            lambda: open('/proc/%d/oom_score_adj' % pid, 'w').close())
print(len(outcomes), unexpected()))py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_EQ(attack.stdout_data, "10 {}\n");
  expect_session_intact("safe");
}

// Every signal-sending call, with the signals that would kill, stop or disturb, at every process
// older than the cell: the checkpoint, a snapshot, the worker's root and init.
TEST_F(RollbackIntegrity, ACellCannotSignalItsCheckpointSnapshotsOrTheWorkerRoot) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  const auto snapshot = session_->snapshot();
  ASSERT_EQ(run("kept = 'after the snapshot'").status, CellStatus::ok);
  auto attack = run(std::string(kAttackPrelude) +
                    R"py(libc = ctypes.CDLL(None, use_errno=True)
def checked(rc):
    if rc != 0:
        raise OSError(ctypes.get_errno(), 'failed')
SYS_tgkill, SYS_tkill, SYS_rt_tgsigqueueinfo = 234, 200, 297
assert len(older) >= 4, older
for pid in older:
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
        tag = '%d/%d ' % (pid, sig)
        attempt(tag + 'kill', lambda: os.kill(pid, sig))
        attempt(tag + 'tgkill', lambda: checked(libc.syscall(SYS_tgkill, pid, pid, sig)))
        attempt(tag + 'tkill', lambda: checked(libc.syscall(SYS_tkill, pid, sig)))
        attempt(tag + 'sigqueue', lambda: checked(libc.sigqueue(pid, sig, 0)))
        info = (ctypes.c_int * 32)(sig, 0, -1)
        attempt(tag + 'rt_tgsigqueueinfo', lambda: checked(libc.syscall(
            SYS_rt_tgsigqueueinfo, pid, pid, sig, ctypes.byref(info))))
        attempt(tag + 'pidfd', lambda: signal.pidfd_send_signal(os.pidfd_open(pid), sig))
        if pid != 1:
            attempt(tag + 'killpg', lambda: os.killpg(os.getpgid(pid), sig))
# A process that ended on its own between the listing and the first attempt (a cell's leftover
# being reaped) answers ESRCH to every call: nothing reached it. Any call that got through shows
# as 'allowed', which stays unexpected; and at least four processes must have been attacked.
gone = {pid for pid in older
        if all(v == 'ESRCH' for k, v in outcomes.items() if k.startswith('%d/' % pid))}
assert len(older) - len(gone) >= 4, (older, gone)
print(len(older), len(outcomes),
      {k: v for k, v in unexpected().items() if int(k.split('/')[0]) not in gone}))py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_NE(attack.stdout_data.find(" {}\n"), std::string::npos) << dump(attack);
  expect_session_intact("after the snapshot");
  session_->restore(snapshot);
  EXPECT_EQ(run("print(kept)").stdout_data, "safe\n");
}

// kill(0) after joining the checkpoint's process group, and kill(-1) to everything: both would
// reach the checkpoint and the worker's root.
TEST_F(RollbackIntegrity, ACellCannotSignalThroughItsProcessGroupOrABroadcast) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  auto attack = run(std::string(kAttackPrelude) +
                    R"py(attempt('broadcast', lambda: os.kill(-1, signal.SIGKILL))
os.setpgid(0, os.getpgid(os.getppid()))
attempt('own group', lambda: os.kill(0, signal.SIGKILL))
attempt('killpg', lambda: os.killpg(0, signal.SIGSTOP))
os.setpgid(0, 0)
print(outcomes))py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_EQ(attack.stdout_data,
            "{'broadcast': 'EPERM', 'own group': 'EPERM', 'killpg': 'EPERM'}\n");
  expect_session_intact("safe");
}

// The kernel's own signal: a process group that becomes orphaned while one of its members is
// stopped gets SIGHUP and SIGCONT. The worker's root shares a group with the first interpreter
// (and init) that nothing anchors; a cell can put a stopped process of its own in it and orphan
// it. Neither the root, the checkpoint, nor init (which would forward the SIGHUP to the root) may
// be hurt by it.
TEST_F(RollbackIntegrity, ACellCannotHaveTheKernelHangUpTheRootsProcessGroup) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  auto attack = run(R"py(import os, signal, time
root_group = os.getpgid(llm_query.__globals__['ROOT_PID'])
r, w = os.pipe()
if os.fork() == 0:
    os.setpgid(0, root_group)
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    os.write(w, str(pid).encode())
    while open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0] != 'T':
        time.sleep(0.01)
    os._exit(0)  # the group loses the member that anchored it
stopped = int(os.read(r, 16))
os.wait()
time.sleep(0.3)
try:
    os.kill(stopped, signal.SIGKILL)
    print('not hung up')
except ProcessLookupError:
    print('hung up')  # the kernel did send the group SIGHUP
)py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_EQ(attack.stdout_data, "hung up\n");
  expect_session_intact("safe");
}

// The indirect routes: SIGIO (F_SETOWN + F_SETSIG would deliver SIGKILL to the checkpoint when a
// pipe becomes readable) and prlimit (a checkpoint with RLIMIT_NOFILE 0 can never fork again).
TEST_F(RollbackIntegrity, ACellCannotRouteSigioToItsCheckpointOrChangeItsLimits) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  auto attack = run(std::string(kAttackPrelude) +
                    R"py(import fcntl, resource, struct
r, w = os.pipe()
ppid = os.getppid()
attempt('F_SETOWN', lambda: fcntl.fcntl(r, fcntl.F_SETOWN, ppid))
attempt('F_SETOWN group', lambda: fcntl.fcntl(r, fcntl.F_SETOWN, -os.getpgid(ppid)))
attempt('F_SETOWN_EX', lambda: fcntl.fcntl(r, 15, struct.pack('ii', 1, ppid)))
fcntl.fcntl(r, 10, signal.SIGKILL)  # F_SETSIG
fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)
os.write(w, b'x')
attempt('prlimit', lambda: resource.prlimit(ppid, resource.RLIMIT_NOFILE, (0, 0)))
print(outcomes, resource.prlimit(ppid, resource.RLIMIT_NOFILE)[0] > 0))py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_EQ(attack.stdout_data,
            "{'F_SETOWN': 'EPERM', 'F_SETOWN group': 'EPERM', 'F_SETOWN_EX': 'EPERM', "
            "'prlimit': 'EPERM'} True\n");
  expect_session_intact("safe");
}

// What a cell may still do: signal itself, its threads, its children and what they started; and
// the rollback still kills what a timed-out cell left behind, reparented or not.
TEST_F(RollbackIntegrity, ACellStillSignalsWhatItStartedAndRollbackStillCleansUp) {
  ASSERT_EQ(run("kept = 'safe'").status, CellStatus::ok);
  auto own = run(R"py(import os, signal, subprocess, threading, time
p = subprocess.Popen(['sleep', '60'])
p.kill()
group = subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 60'], start_new_session=True)
time.sleep(0.2)
os.killpg(group.pid, signal.SIGTERM)
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append('usr1'))
os.kill(os.getpid(), signal.SIGUSR1)
signal.raise_signal(signal.SIGUSR1)
t = threading.Thread(target=time.sleep, args=(0.2,))
t.start()
signal.pthread_kill(t.ident, 0)
t.join()
os.kill(p.pid, 0)  # a zombie still exists
print(p.wait(), group.wait(), got))py");
  EXPECT_EQ(own.status, CellStatus::ok) << dump(own);
  EXPECT_EQ(own.stdout_data, "-9 -15 ['usr1', 'usr1']\n");

  // A double-forked daemon in its own session, reparented to the worker's root: the timed-out
  // cell's rollback (done by the older checkpoint) must still reach it.
  auto leave = run(R"py(import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open('/tmp/daemon.pid', 'w') as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
while True: pass)py",
                   1500ms);
  EXPECT_EQ(leave.status, CellStatus::timeout) << dump(leave);
  auto gone = run(R"py(import os
pid = int(open('/tmp/daemon.pid').read())
try:
    os.kill(pid, 0)
    print(open('/proc/%d/stat' % pid).read().split()[2])
except ProcessLookupError:
    print('gone'))py");
  EXPECT_EQ(gone.stdout_data, "gone\n") << dump(gone);

  auto crash = run("import os\nkept = 'crashing'\nos.kill(os.getpid(), 9)");
  EXPECT_EQ(crash.status, CellStatus::crashed) << dump(crash);
  EXPECT_TRUE(crash.rolled_back);
  expect_session_intact("safe");
}

// A policy with kill actions compiles to a notify program (init names the denied syscall); the
// guard is added to that one, and a kill rule on a guarded syscall still kills, never lets a call
// through.
TEST(RollbackIntegrityWithKillRules, TheGuardHoldsOnTopOfAPolicysNotifyProgram) {
  Policy policy = load_policy("python-repl");
  policy.limits.wall_time = 10s;
  SeccompRule kill_rules;
  kill_rules.names = {"getcpu", "tkill"};
  kill_rules.action = "SCMP_ACT_KILL_PROCESS";
  policy.seccomp.syscalls.push_back(kill_rules);
  auto session = make_backend("namespace")->open_session(policy, {});
  auto attack = session->execute(std::string(kAttackPrelude) +
                                 R"py(import subprocess
attempt('checkpoint', lambda: os.kill(os.getppid(), 9))
p = subprocess.Popen(['sleep', '60'])
p.kill()
print(outcomes, p.wait()))py");
  EXPECT_EQ(attack.status, CellStatus::ok) << dump(attack);
  EXPECT_EQ(attack.stdout_data, "{'checkpoint': 'EPERM'} -9\n");
  // tkill is guarded, but the policy kills it: the caller dies of SIGSYS (a plain kill, not
  // named) rather than the call running; the session rolls back.
  auto killed =
      session->execute("import ctypes, os\nctypes.CDLL(None).syscall(200, os.getppid(), 9)");
  EXPECT_EQ(killed.status, CellStatus::crashed) << dump(killed);
  EXPECT_NE(killed.error.find("SIGSYS"), std::string::npos) << killed.error;
  EXPECT_TRUE(killed.rolled_back);
  EXPECT_EQ(session->execute("print('alive')").stdout_data, "alive\n");
}

}  // namespace
}  // namespace rlm::test
