#!/usr/bin/env python3
"""The multi-tenant soak of ``rlm-sandbox serve`` (issue 24): several clients of several local
uids share ONE server for a while, doing a random mix of runs, REPL sessions and hostile cells,
each planting a token of its own everywhere it can and dumping everything it can see. The soak
passes when no client ever sees another client's token, the server stays up within a memory and
fd bound, and nothing is left on the host once the server has stopped.

Usage (as root: the clients run as uids 0, 65534 and 60001)::

    python3 tools/soak/tenants.py --bin build/bin --seconds 1200 [--clients 8] [--report r.json]

ctest runs a 45-second version (``soak_tenants_short``, label ``soak``; tests/soak/).

How it works:

- The coordinator (this script without ``--client``) makes a temporary directory of its own
  (0755, so every uid reaches the socket), starts one ``rlm-sandbox serve`` in it (a run pool of
  ``default``, a session pool of ``python-repl``, ``--allow-uid`` for the non-root uids, and
  ``--permit-bind UID:DIR:rw`` giving each uid a directory of its own), then starts the clients:
  this same script with ``--client``, each as its uid with a token ``soak-tok-K-HEX``.
- Each client loops until the deadline picking a random operation (``Tenant.OPERATIONS``): a run
  that plants its mark (the token and the operation's number) in /tmp, the environment, a
  ``setsid`` background process's argv and a file in its read-write bind /out, then dumps /tmp,
  ``ps``, every process's environment and /out; a session whose cells plant the mark in globals,
  /tmp and the environment, ask ``llm_query`` (answered by the client with the mark) and dump what
  they see; and hostile runs and cells (memory balloon, fork loop, endless loop, output flood,
  ``chmod u+s`` in /out, 200 MB into /tmp). Everything a client gets back is scanned for marks:
  another client's is a cross-client trace; its own from an earlier operation, in a sandbox that
  should be fresh, is a stale trace. Refusals and failures are counted by kind, never fatal; an
  ``unavailable`` refusal (e.g. a per-uid connection cap) is retried after a short sleep.
- A monitor samples the server's VmRSS and open fds every ``--sample-seconds``.
- After the deadline the coordinator stops the server (SIGTERM) and checks the host: each client's
  output directory holds only files of the client's uid with no set-id bit; no process of the
  sandbox uid range (attributed to this server by its cgroup) or holding a token is left; no
  cgroup this server made (``<pid>-<starttime>-...`` under ``rlm-sandbox/``) is left.

The checks (``make_checks``): the server stayed up; every client finished and did at least one
whole dump run and dump session (else "no trace" would prove nothing); no cross-client trace; no
stale trace; every ``chmod`` of a set-id bit in /out refused, and tested at least once (a /out the
sandbox cannot write tests nothing); the server's VmRSS and fds within ``--max-rss-mib`` and
``--max-fds``; the server stopped on SIGTERM and removed its socket; and the three leak checks.
Errors (refusals, ``sandbox_error``, a /out that cannot be bound) and hostile outcomes other than
the expected ones are reported by kind, with samples, but fail nothing by themselves.

It prints a summary and ends stdout with ``soak: N passed, M failed`` (the checks); the exit status
is 0 when every check held, 1 otherwise, 77 when it cannot run here (not root, no binaries).
Ctrl-C, SIGTERM or an error still stop the clients and the server and remove the directory.
Killed with SIGKILL (a ctest timeout), it still leaves no process: the clients die with it and
the server gets SIGTERM (PR_SET_PDEATHSIG); only its /tmp/rlm-soak-tenants-* directory is left.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import random
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

sys.dont_write_bytecode = True  # the clients import the package from the source tree

#: The uids the clients run as, in turn: root, nobody, and an id with no account.
TENANT_UIDS: Tuple[Tuple[int, int], ...] = ((0, 0), (65534, 65534), (60001, 60001))
#: The host uids a root server maps sandboxes to (runtime/host/sandbox_uid.hpp).
SANDBOX_UID_FIRST, SANDBOX_UID_LAST = 1879048192, 1879113727
#: A mark: ``soak-tok-<client>-<12 hex>`` is a client's token, ``-<n>`` the operation's number.
MARK = re.compile(r"soak-tok-(\d+)-([0-9a-f]{12})(?:-(\d+))?")
#: The exit status that tells ctest the soak could not run here.
SKIP = 77
#: Seconds a client may overrun the deadline (its last operation, a slow teardown) before it is
#: killed and counted as hung.
CLIENT_GRACE_SECONDS = 90
SKIP_MARK = "soak: skipped"


# ------------------------------------------------------------------------------------------------
# Common helpers
# ------------------------------------------------------------------------------------------------

def repo_root() -> str:
    """The source tree this script is in (tools/soak/ -> the top)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def die_with_parent(expected_parent: int) -> None:
    """Asks the kernel for SIGKILL when the coordinator dies (even by SIGKILL, e.g. a ctest
    timeout), so no client outlives it. Set after the uid change: that change clears it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != expected_parent:  # it died before the prctl took effect
        os._exit(1)


def proc_start_ticks(pid: int) -> Optional[int]:
    """Field 22 of /proc/PID/stat (the start time), as run ids name their creator."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2:].split()[19])


def reachable_by_all(path: str, read: bool = False) -> bool:
    """Whether any uid may run (or with `read`, read) `path`: every directory on the way
    searchable by others, the file executable (readable) by others. A pyenv under /root is not."""
    path = os.path.realpath(path)
    bit = stat.S_IROTH if read else stat.S_IXOTH
    if not os.path.isfile(path) or not os.stat(path).st_mode & bit:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def client_python() -> Optional[str]:
    """An interpreter every client uid can run: this one if it can, else the system's."""
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate and reachable_by_all(candidate):
            return candidate
    return None


def said(output: str, line: str) -> bool:
    """Whether `output` has `line` as a whole line (a dump's ps section quotes the script, so a
    substring test would find what the script only says it would print)."""
    return re.search(f"(?m)^{re.escape(line)}$", output) is not None


def count_by(items: Dict[str, int], key: str, n: int = 1) -> None:
    items[key] = items.get(key, 0) + n


# ------------------------------------------------------------------------------------------------
# The client: one tenant's loop of operations
# ------------------------------------------------------------------------------------------------

RUN_DUMP = r"""M='{mark}'
echo "$M" > "/tmp/mark-$M"
echo "$M" > "/dev/shm/mark-$M" 2>/dev/null
setsid sh -c 'sleep 60; :' "$M" </dev/null >/dev/null 2>&1 &
if echo "$M" > "/out/$M.txt" 2>/dev/null; then echo OUT_WRITE=ok; else echo OUT_WRITE=failed; fi
echo '==tmp'
for f in /tmp/* /tmp/.[!.]* /dev/shm/*; do
  [ -f "$f" ] && {{ echo "$f"; head -c 4096 "$f"; echo; }}
done
echo '==ps'
ps -eww -o pid,uid,args
echo '==environ'
for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; echo; done
echo '==out'
ls -la /out
echo '==end'
"""

SESSION_PLANT = """MARK = {mark!r}
import os
os.environ['SOAK_MARK'] = MARK
with open('/tmp/mark-' + MARK, 'w') as _f:
    _f.write(MARK)
REPLY = llm_query('question from ' + MARK)
print('LLM', REPLY)
"""

SESSION_DUMP = """import glob, os, subprocess
print('==globals')
for _k, _v in sorted(globals().items()):
    if isinstance(_v, str):
        print(_k, _v[:300])
print('==tmp')
for _p in sorted(glob.glob('/tmp/*') + glob.glob('/tmp/.*') + glob.glob('/dev/shm/*')):
    try:
        with open(_p, errors='replace') as _f:
            print(_p, _f.read(4096))
    except OSError as _e:
        print(_p, _e)
print('==ps')
print(subprocess.run(['ps', '-eww', '-o', 'pid,uid,args'], capture_output=True, text=True).stdout)
print('==environ')
for _p in glob.glob('/proc/[0-9]*/environ'):
    try:
        with open(_p, 'rb') as _f:
            print(_f.read().replace(b'\\0', b'\\n').decode(errors='replace'))
    except OSError:
        pass
print('==llm', llm_query('again from ' + MARK))
"""

BALLOON_RUN = """chunks = []
while True:
    chunks.append(b'x' * (8 << 20))
"""

FORK_LOOP_RUN = """import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as error:
    print('fork failed after', n, error)
"""

SETUID_RUN = r"""F=/out/suid-{seq}
printf '#!/bin/sh\necho hi\n' > "$F" 2>/dev/null || {{ echo SETUID=untestable; exit 0; }}
chmod 0755 "$F"
chmod u+s "$F" 2>/dev/null && echo CHMOD=allowed || echo CHMOD=refused
chmod g+s "$F" 2>/dev/null && echo CHMOD=allowed || echo CHMOD=refused
chmod 6755 "$F" 2>/dev/null && echo CHMOD=allowed || echo CHMOD=refused
chmod g+s /out 2>/dev/null && echo CHMOD=allowed || echo CHMOD=refused
echo MODE=$(stat -c %a "$F") DIRMODE=$(stat -c %a /out)
"""

BIG_TMP_RUN = r"""dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1
echo DD_RC=$?
echo SIZE_MB=$(du -m /tmp/big | cut -f1)
"""


class Stats:
    """What one client did and saw, written to its result file after every operation (so a
    client killed for hanging still reports what it did before)."""

    def __init__(self, client_id: int, uid: int) -> None:
        self.client_id = client_id
        self.uid = uid
        self.ops: Dict[str, int] = {}                    # operation -> attempts
        self.outcomes: Dict[str, Dict[str, int]] = {}    # operation -> status -> count
        self.errors: Dict[str, int] = {}                 # error kind -> count
        self.error_samples: List[str] = []
        self.traces: List[Dict[str, Any]] = []           # samples; counts below
        self.trace_count = 0
        self.stale: List[Dict[str, Any]] = []
        self.stale_count = 0
        self.findings: Dict[str, int] = {}               # unexpected but not a trace
        self.finding_samples: List[str] = []
        self.out_writes = {"ok": 0, "failed": 0, "bind_failed": 0}
        self.setuid = {"refused": 0, "allowed": 0, "untestable": 0}
        self.dump_samples: Dict[str, str] = {}          # one output of each dump, to read
        self.clean = {"run_dump": 0, "session_dump": 0}  # dumps that ran to their end
        self.started = time.time()

    def outcome(self, op: str, status: str) -> None:
        count_by(self.outcomes.setdefault(op, {}), status)

    def error(self, kind: str, message: str) -> None:
        count_by(self.errors, kind)
        sample = f"{kind}: {message}"[:400]
        if len(self.error_samples) < 12 and sample not in self.error_samples:
            self.error_samples.append(sample)

    def finding(self, kind: str, message: str) -> None:
        count_by(self.findings, kind)
        if len(self.finding_samples) < 12:
            self.finding_samples.append(f"{kind}: {message}"[:400])

    def to_json(self) -> Dict[str, Any]:
        return {"client_id": self.client_id, "uid": self.uid, "ops": self.ops,
                "outcomes": self.outcomes, "errors": self.errors,
                "error_samples": self.error_samples, "trace_count": self.trace_count,
                "traces": self.traces, "stale_count": self.stale_count, "stale": self.stale,
                "findings": self.findings, "finding_samples": self.finding_samples,
                "out_writes": self.out_writes, "setuid": self.setuid, "clean": self.clean,
                "dump_samples": self.dump_samples,
                "seconds": round(time.time() - self.started, 1)}


class Tenant:
    """One client: a Server connection factory, its token, its /out bind, and the operations.

    Each operation gets a mark, ``<token>-<n>``; everything the operation sees is scanned for
    marks (``scan``). Operations raise freely: ``step`` counts the exception by kind."""

    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, args.python_dir)
        from rlm_sandbox.server import Server  # noqa: E402 - the path is the caller's
        from rlm_sandbox._wire import ServerError  # noqa: E402
        from rlm_sandbox.result import RlmSandboxError  # noqa: E402
        self.ServerError, self.RlmSandboxError = ServerError, RlmSandboxError
        self.server = Server(args.socket, connect_timeout=30)
        self.client_id = args.client_id
        self.token = args.token
        self.out_dir = args.out_dir
        self.deadline = args.deadline
        self.rng = random.Random(args.seed)
        self.stats = Stats(args.client_id, os.getuid())
        self.result_path = args.result
        self.seq = 0
        self.out_policy: Optional[Dict[str, Any]] = None

    # -- the loop ------------------------------------------------------------------------------

    #: (name, weight): about a third dumps in runs, a quarter sessions, the rest hostile.
    OPERATIONS: Tuple[Tuple[str, int], ...] = (
        ("run_dump", 34), ("session_dump", 26),
        ("hostile_balloon_run", 5), ("hostile_fork_run", 5), ("hostile_loop_run", 4),
        ("hostile_flood_run", 5), ("hostile_setuid_run", 6), ("hostile_bigtmp_run", 4),
        ("hostile_loop_cell", 4), ("hostile_balloon_cell", 4), ("hostile_flood_cell", 3))

    def loop(self) -> None:
        names = [name for name, _ in self.OPERATIONS]
        weights = [weight for _, weight in self.OPERATIONS]
        while time.time() < self.deadline:
            self.step(self.rng.choices(names, weights)[0])
            self.save()

    def step(self, op: str) -> None:
        """Runs one operation; a refusal or failure is counted, never raised. An ``unavailable``
        refusal (the server is busy, or a per-uid cap) is retried after a short sleep."""
        self.seq += 1
        count_by(self.stats.ops, op)
        try:
            getattr(self, op)(f"{self.token}-{self.seq}")
        except self.ServerError as error:
            self.stats.error(f"server_{error.kind}", f"{op}: {error}")
            self.stats.outcome(op, f"error_{error.kind}")
            if error.kind == "unavailable":
                time.sleep(self.rng.uniform(0.2, 1.0))
        except self.RlmSandboxError as error:
            self.stats.error("client_error", f"{op}: {error}")
            self.stats.outcome(op, "error_client")
        except Exception as error:  # noqa: BLE001 - a harness bug is a finding, not the end
            self.stats.error(f"exception_{type(error).__name__}",
                             f"{op}: {error}\n{traceback.format_exc(limit=4)}")
            self.stats.outcome(op, "error_exception")

    def save(self) -> None:
        temporary = self.result_path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(self.stats.to_json(), f)
        os.replace(temporary, self.result_path)

    # -- the scan for traces -------------------------------------------------------------------

    def scan(self, op: str, mark: str, text: str, own_any_seq: bool = False) -> None:
        """Counts every mark in `text` that is not this operation's own: another client's is a
        cross-client trace; this client's from another operation a stale one (unless
        `own_any_seq`: /out is this client's own and keeps its earlier marks)."""
        own_seq = mark.rsplit("-", 1)[1]
        own_client, own_hex = self.token.split("-")[2:4]
        for match in MARK.finditer(text):
            client, hexpart, seq = match.groups()
            start = max(0, match.start() - 120)
            context = text[start:match.end() + 60].replace("\n", " | ")
            sample = {"op": op, "mark": mark, "seen": match.group(0), "context": context}
            if (client, hexpart) != (own_client, own_hex):
                self.stats.trace_count += 1
                if len(self.stats.traces) < 20:
                    self.stats.traces.append(sample)
            elif seq is not None and seq != own_seq and not own_any_seq:
                self.stats.stale_count += 1
                if len(self.stats.stale) < 20:
                    self.stats.stale.append(sample)

    def scan_sections(self, op: str, mark: str, text: str) -> None:
        """A run dump's output by section: the ``==out`` one may hold earlier marks of this
        client (its files in /out), the others may not."""
        for section in re.split(r"(?m)^(?===)", text):
            self.scan(op, mark, section, own_any_seq=section.startswith("==out"))

    def scan_cell(self, op: str, mark: str, cell: Any) -> None:
        text = "\n".join(str(part) for part in (cell.stdout, cell.stderr, cell.error,
                                                 cell.final, cell.answer) if part)
        self.scan(op, mark, text)

    # -- runs ----------------------------------------------------------------------------------

    def policy_with_out(self) -> Dict[str, Any]:
        """The server's ``default`` with this client's directory bound read-write at /out."""
        if self.out_policy is None:
            policy = self.server.policy("default")
            policy["filesystem"]["mounts"].append(
                {"type": "bind", "source": self.out_dir, "target": "/out", "readonly": False})
            self.out_policy = policy
        return json.loads(json.dumps(self.out_policy))

    def run_with_out(self, op: str, argv: List[str], **run: Any) -> Tuple[Any, bool]:
        """A run with /out bound; when the sandbox cannot mount the bind (a server whose
        sandboxes cannot reach the directory), the failure is counted and, for a dump, the run
        is made again without /out, so the dump still looks for traces. Returns (result,
        whether /out was bound)."""
        result = self.server.run(argv, overrides=self.policy_with_out(), **run)
        if result.status == "sandbox_error" and "/out" in result.detail:
            self.stats.out_writes["bind_failed"] += 1
            self.stats.error("out_bind_failed", f"{op}: {result.detail}")
            if op == "run_dump":
                result = self.server.run(argv, **run)
            return result, False
        return result, True

    def run_dump(self, mark: str) -> None:
        result, _ = self.run_with_out("run_dump", ["sh", "-c", RUN_DUMP.format(mark=mark)],
                                      env={"SOAK_MARK": mark}, timeout=8)
        self.stats.outcome("run_dump", result.status)
        self.scan_sections("run_dump", mark, result.stdout + "\n" + result.stderr)
        if said(result.stdout, "OUT_WRITE=ok"):
            self.stats.out_writes["ok"] += 1
        elif said(result.stdout, "OUT_WRITE=failed"):
            self.stats.out_writes["failed"] += 1
        if result.status == "ok" and said(result.stdout, "==end"):
            self.stats.clean["run_dump"] += 1
            self.stats.dump_samples.setdefault("run_dump", result.stdout[:6000])
        elif result.status == "sandbox_error":
            self.stats.error("sandbox_error", f"run_dump: {result.detail}")

    def hostile_run(self, op: str, mark: str, expected: Tuple[str, ...], **run: Any) -> Any:
        """A hostile run: its status is recorded, one outside `expected` is a finding."""
        if run.pop("with_out", False):
            result, bound = self.run_with_out(op, run.pop("argv"), **run)
            if not bound:
                self.stats.outcome(op, "out_bind_failed")
                return result
        else:
            result = self.server.run(**run)
        self.stats.outcome(op, result.status)
        self.scan(op, mark, result.stdout[:65536] + "\n" + result.stderr[:65536])
        if result.status == "sandbox_error":
            self.stats.error("sandbox_error", f"{op}: {result.detail}")
        elif result.status not in expected:
            self.stats.finding(f"{op}_{result.status}",
                               f"{result.detail} {result.stdout[-200:]} {result.stderr[-200:]}")
        return result

    def hostile_balloon_run(self, mark: str) -> None:
        self.hostile_run("hostile_balloon_run", mark, ("memory_limit", "signaled", "exit_nonzero"),
                         code=BALLOON_RUN, limits={"memory_bytes": 64 << 20}, timeout=8)

    def hostile_fork_run(self, mark: str) -> None:
        self.hostile_run("hostile_fork_run", mark,
                         ("ok", "pids_limit", "exit_nonzero", "timeout", "signaled"),
                         code=FORK_LOOP_RUN, timeout=5)

    def hostile_loop_run(self, mark: str) -> None:
        self.hostile_run("hostile_loop_run", mark, ("timeout", "cpu_limit"),
                         argv=["sh", "-c", "while :; do :; done"], timeout=1)

    def hostile_flood_run(self, mark: str) -> None:
        result = self.hostile_run("hostile_flood_run", mark, ("output_limit",),
                                  argv=["yes", "flood without any mark"],
                                  limits={"output_bytes": 256 << 10}, timeout=8)
        if result.status == "output_limit" and not result.stdout_truncated:
            self.stats.finding("hostile_flood_run_not_truncated", result.detail)

    def hostile_setuid_run(self, mark: str) -> None:
        result = self.hostile_run("hostile_setuid_run", mark, ("ok",),
                                  argv=["sh", "-c", SETUID_RUN.format(seq=self.seq)],
                                  with_out=True, timeout=8)
        if said(result.stdout, "SETUID=untestable") or result.status != "ok":
            self.stats.setuid["untestable"] += 1
            return
        modes = re.search(r"MODE=(\d+) DIRMODE=(\d+)", result.stdout)
        set_id = modes is not None and any(len(m) == 4 and int(m[0]) & 6 for m in modes.groups())
        if said(result.stdout, "CHMOD=allowed") or set_id:
            self.stats.setuid["allowed"] += 1
            self.stats.finding("setuid_allowed", result.stdout[-300:])
        elif said(result.stdout, "CHMOD=refused"):
            self.stats.setuid["refused"] += 1
        else:
            self.stats.setuid["untestable"] += 1

    def hostile_bigtmp_run(self, mark: str) -> None:
        result = self.hostile_run("hostile_bigtmp_run", mark,
                                  ("ok", "exit_nonzero", "signaled", "memory_limit"),
                                  argv=["sh", "-c", BIG_TMP_RUN], timeout=8)
        size = re.search(r"SIZE_MB=(\d+)", result.stdout)
        if size and int(size.group(1)) >= 200:
            self.stats.finding("bigtmp_not_bounded", result.stdout[-300:])

    # -- sessions ------------------------------------------------------------------------------

    def open_session(self, mark: str, **options: Any) -> Any:
        """A python-repl session whose context and llm_query answers carry `mark`: a session or
        an answer routed to the wrong client shows up as a trace."""
        return self.server.session("python-repl", context=f"context of {mark}",
                                   on_llm_query=lambda prompt, model: f"answer for {prompt}",
                                   lifetime=120, **options)

    def cell(self, op: str, mark: str, session: Any, code: str, **kw: Any) -> Any:
        cell = session.execute(code, **kw)
        self.scan_cell(op, mark, cell)
        if cell.status == "session_error":
            self.stats.error("session_error", f"{op}: {cell.error}")
        return cell

    def session_dump(self, mark: str) -> None:
        op = "session_dump"
        with self.open_session(mark) as session:
            planted = self.cell(op, mark, session, SESSION_PLANT.format(mark=mark))
            if planted.ok and f"answer for question from {mark}" not in planted.stdout:
                self.stats.finding("llm_answer_mismatch", planted.stdout[-300:])
            dump = self.cell(op, mark, session, SESSION_DUMP)
            if self.rng.random() < 0.3:
                self.snapshot_round(op, mark, session)
            self.stats.outcome(op, dump.status)
            if planted.ok and dump.ok and said(dump.stdout, f"==llm answer for again from {mark}"):
                self.stats.clean["session_dump"] += 1
                self.stats.dump_samples.setdefault("session_dump", dump.stdout[:6000])

    def snapshot_round(self, op: str, mark: str, session: Any) -> None:
        """A snapshot, a change, a restore: the change must be gone."""
        snapshot = session.snapshot()
        self.cell(op, mark, session, "EXTRA = MARK")
        session.restore(snapshot)
        check = self.cell(op, mark, session, "print('EXTRA' in globals(), MARK)")
        if check.ok and not check.stdout.startswith("False"):
            self.stats.finding("restore_kept_a_change", check.stdout[-200:])

    def hostile_cell(self, op: str, mark: str, code: str, expected: Tuple[str, ...],
                     timeout: Optional[float] = None, **options: Any) -> None:
        """A session whose middle cell is hostile: its status is recorded; the session must go
        on afterwards with the state from before it (a rollback keeps MARK)."""
        with self.open_session(mark, **options) as session:
            self.cell(op, mark, session, SESSION_PLANT.format(mark=mark))
            hostile = self.cell(op, mark, session, code, timeout=timeout)
            status = hostile.status + ("+truncated" if hostile.stdout_truncated else "")
            self.stats.outcome(op, status)
            if status not in expected:
                self.stats.finding(f"{op}_{status}", str(hostile.error)[-300:])
            after = self.cell(op, mark, session, "print('alive', MARK)")
            if not (after.ok and mark in after.stdout):
                self.stats.finding(f"{op}_session_lost", f"{after.status} {after.error}"[-300:])

    def hostile_loop_cell(self, mark: str) -> None:
        self.hostile_cell("hostile_loop_cell", mark, "while True:\n    pass\n", ("timeout",),
                          timeout=1)

    def hostile_balloon_cell(self, mark: str) -> None:
        self.hostile_cell("hostile_balloon_cell", mark, "BIG = b'x' * (400 << 20)\n",
                          ("memory_limit", "crashed", "error"), memory="128M")

    def hostile_flood_cell(self, mark: str) -> None:
        self.hostile_cell("hostile_flood_cell", mark, "print('y' * (6 << 20))\n",
                          ("ok+truncated",))


def client_main(args: argparse.Namespace) -> int:
    """A client process: already running as its uid (the coordinator started it so)."""
    die_with_parent(args.parent)
    tenant = Tenant(args)
    try:
        tenant.loop()
    finally:
        tenant.save()
    return 0


# ------------------------------------------------------------------------------------------------
# The coordinator: directories, the server, the clients, the monitor
# ------------------------------------------------------------------------------------------------

class Client:
    """A client process as the coordinator sees it."""

    def __init__(self, client_id: int, uid: int, gid: int, token: str, out_dir: str,
                 result_path: str, log_path: str) -> None:
        self.client_id, self.uid, self.gid, self.token = client_id, uid, gid, token
        self.out_dir, self.result_path, self.log_path = out_dir, result_path, log_path
        self.proc: Optional[subprocess.Popen] = None
        self.hung = False

    def result(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.result_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def log_tail(self, size: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def make_dirs(root: str, clients: int) -> Tuple[Dict[int, str], List[Client]]:
    """The directory tree: out/uid-U (the uid's permitted bind, its own, 0755 so that the
    server's sandboxes can reach beneath it), in it client-K (the client's /out, 0700: nobody
    else's business); results/client-K (where the client writes its result, 0700); logs/.
    Returns the uid directories and the clients (tokens drawn here)."""
    def make(path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
        os.mkdir(path)
        os.chown(path, uid, gid)
        os.chmod(path, mode)  # not mkdir's mode: the umask would have its say

    os.chmod(root, 0o755)
    for sub in ("out", "results", "logs"):
        make(os.path.join(root, sub), 0o755)
    uid_dirs: Dict[int, str] = {}
    for uid, gid in TENANT_UIDS:
        uid_dirs[uid] = os.path.join(root, "out", f"uid-{uid}")
        make(uid_dirs[uid], 0o755, uid, gid)
    result: List[Client] = []
    for k in range(clients):
        uid, gid = TENANT_UIDS[k % len(TENANT_UIDS)]
        out_dir = os.path.join(uid_dirs[uid], f"client-{k}")
        results = os.path.join(root, "results", f"client-{k}")
        for path in (out_dir, results):
            make(path, 0o700, uid, gid)
        token = f"soak-tok-{k}-{secrets.token_hex(6)}"
        result.append(Client(k, uid, gid, token, out_dir, os.path.join(results, "result.json"),
                             os.path.join(root, "logs", f"client-{k}.log")))
    return uid_dirs, result


def start_server(binary: str, root: str, uid_dirs: Dict[int, str], args: argparse.Namespace,
                 log) -> subprocess.Popen:
    """One ``rlm-sandbox serve`` for every client, in its own process group; it gets SIGTERM if
    this process dies (PR_SET_PDEATHSIG), so it never outlives the soak."""
    command = [binary, "serve", "--socket", os.path.join(root, "server.sock"),
               "--socket-mode", "0666", "--pool", f"default={args.pool}",
               "--session-pool", f"python-repl={args.session_pool}"]
    for uid, path in sorted(uid_dirs.items()):
        if uid != os.getuid():
            command += ["--allow-uid", str(uid)]
        command += ["--permit-bind", f"{uid}:{path}:rw"]

    def preexec() -> None:  # runs before any thread of ours exists
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)

    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, preexec_fn=preexec, cwd="/")


def wait_for_server(socket_path: str, server: subprocess.Popen, python_dir: str,
                    seconds: float) -> Dict[str, Any]:
    """The server's hello once it answers; RuntimeError if it exits or never answers."""
    sys.path.insert(0, python_dir)
    from rlm_sandbox.server import Server  # noqa: E402
    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"rlm-sandbox serve exited with status {server.returncode}")
        if os.path.exists(socket_path):
            try:
                return Server(socket_path, connect_timeout=10).hello()
            except Exception as error:  # noqa: BLE001 - not up yet
                last = str(error)
        time.sleep(0.1)
    raise RuntimeError(f"rlm-sandbox serve did not answer within {seconds} s ({last})")


def server_hello(socket_path: str) -> Optional[Dict[str, Any]]:
    from rlm_sandbox.server import Server  # noqa: E402 - on sys.path since wait_for_server
    try:
        return Server(socket_path, connect_timeout=10).hello()
    except Exception:  # noqa: BLE001 - a dead or stuck server is reported by the caller
        return None


def start_client(client: Client, args: argparse.Namespace, root: str, deadline: float) -> None:
    """The client as its uid and gid with no supplementary groups, in a session of its own (so
    its whole group can be killed), with a minimal environment."""
    command = [args.python, os.path.abspath(__file__), "--client",
               "--client-id", str(client.client_id), "--token", client.token,
               "--socket", os.path.join(root, "server.sock"), "--out-dir", client.out_dir,
               "--result", client.result_path, "--deadline", repr(deadline),
               "--seed", str(args.seed * 1000 + client.client_id), "--parent", str(os.getpid()),
               "--python-dir", args.python_dir]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": "/", "LANG": "C.UTF-8"}
    with open(client.log_path, "wb") as log:
        client.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       env=env, cwd="/", user=client.uid, group=client.gid,
                                       extra_groups=[], start_new_session=True)


def kill_group(proc: Optional[subprocess.Popen], sig: int = signal.SIGKILL) -> None:
    """Signals a process started with start_new_session (its group is its pid)."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ServerMonitor(threading.Thread):
    """Samples the server every `interval` seconds: VmRSS and Threads (/proc/PID/status) and the
    number of open fds (/proc/PID/fd). ``sample()`` may also be called directly."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(name="server-monitor", daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: List[Dict[str, Any]] = []
        self.started_at = time.monotonic()
        self.stop_event = threading.Event()
        self.lock = threading.Lock()

    def sample(self) -> Optional[Dict[str, Any]]:
        try:
            fields = {}
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return None
        if fields.get("State", "").startswith("Z"):
            return None
        entry = {"t": round(time.monotonic() - self.started_at, 1),
                 "rss_mib": round(int(fields.get("VmRSS", "0 kB").split()[0]) / 1024, 1),
                 "fds": fds, "threads": int(fields.get("Threads", "0"))}
        with self.lock:
            self.samples.append(entry)
        return entry

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.sample()

    def summary(self) -> Dict[str, Any]:
        with self.lock:
            samples = list(self.samples)
        if not samples:
            return {"samples": 0}
        out: Dict[str, Any] = {"samples": len(samples), "series": samples}
        for key in ("rss_mib", "fds", "threads"):
            values = [s[key] for s in samples]
            out[key] = {"start": values[0], "max": max(values), "end": values[-1]}
        return out


# ------------------------------------------------------------------------------------------------
# Leak checks on the host, after the server has stopped
# ------------------------------------------------------------------------------------------------

def check_out_dirs(clients: List[Client]) -> Dict[str, Any]:
    """Every entry of each client's /out (the directory too) is the client's uid's, with no
    set-uid or set-gid bit: a sandbox's file must not outlive it as another identity's."""
    problems: List[str] = []
    entries = 0
    for client in clients:
        for base, dirs, files in os.walk(client.out_dir):
            for path in [base] + [os.path.join(base, n) for n in dirs + files]:
                if path != base and os.path.isdir(path) and not os.path.islink(path):
                    continue  # walked itself as a base
                entries += 1
                st = os.lstat(path)
                if st.st_uid != client.uid:
                    problems.append(f"{path}: uid {st.st_uid}, not client {client.client_id}'s "
                                    f"{client.uid}")
                if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    problems.append(f"{path}: mode {stat.filemode(st.st_mode)} has a set-id bit")
    return {"ok": not problems, "entries": entries, "problems": problems[:50],
            "problem_count": len(problems)}


def run_id_owner(pid: int) -> Optional[int]:
    """The pid in the run id of the rlm-sandbox cgroup `pid` is in, if any."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            match = re.search(r"/rlm-sandbox/(\d+)-\d+-\d+-\d+", f.read())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def scan_processes(tokens: List[str], server_pid: int, since_ticks: int) -> Dict[str, List[str]]:
    """Processes of the sandbox uid range, split into this server's (its cgroup's run id names
    it, or none does and it started after the server) and others' (another runtime's sandbox:
    other tests may run beside the soak); and any process whose argv holds a token."""
    ours: List[str] = []
    foreign: List[str] = []
    tokens_seen: List[str] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/status") as f:
                uids = [int(u) for line in f if line.startswith("Uid:")
                        for u in line.split()[1:]]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError):
            continue
        described = f"pid {pid} uids {uids} argv {argv[:200]!r}"
        if any(token in argv for token in tokens):
            tokens_seen.append(described)
        if not any(SANDBOX_UID_FIRST <= u <= SANDBOX_UID_LAST for u in uids):
            continue
        owner = run_id_owner(pid)
        started = proc_start_ticks(pid) or 0
        if owner == server_pid or (owner is None and started >= since_ticks):
            ours.append(described)
        else:
            foreign.append(described)
    return {"ours": ours, "foreign": foreign, "tokens": tokens_seen}


def check_processes(tokens: List[str], server_pid: int, since_ticks: int,
                    wait_seconds: float = 15) -> Dict[str, Any]:
    """scan_processes until nothing of ours is left (a sandbox's teardown may lag its server's
    exit by a moment) or `wait_seconds` pass."""
    deadline = time.monotonic() + wait_seconds
    while True:
        found = scan_processes(tokens, server_pid, since_ticks)
        if (not found["ours"] and not found["tokens"]) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return {"ok": not found["ours"] and not found["tokens"], "sandbox_uid_processes":
            found["ours"][:20], "token_processes": found["tokens"][:20],
            "foreign_sandbox_processes": len(found["foreign"])}


def cgroup_dirs() -> List[str]:
    """Every run group under an ``rlm-sandbox`` parent in the cgroup file system (v1
    hierarchies and v2, a few levels deep)."""
    found: List[str] = []
    for depth in range(0, 4):
        pattern = os.path.join("/sys/fs/cgroup", *(["*"] * depth), "rlm-sandbox", "*")
        found += [p for p in glob.glob(pattern) if os.path.isdir(p)]
    return sorted(set(found))


def check_cgroups(server_pid: int, server_ticks: Optional[int], before: List[str],
                  wait_seconds: float = 15) -> Dict[str, Any]:
    """No group named with this server's run id (``<pid>-<starttime>-``) is left."""
    prefix = f"{server_pid}-{server_ticks}-" if server_ticks is not None else f"{server_pid}-"
    deadline = time.monotonic() + wait_seconds
    while True:
        after = cgroup_dirs()
        ours = [p for p in after if os.path.basename(p).startswith(prefix)]
        if not ours or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    # Reported above; now removed (rmdir takes only an empty group), so a failed soak leaves
    # nothing either. The server is gone: nothing else would collect them until the next run.
    removed = 0
    for path in ours:
        try:
            os.rmdir(path)
            removed += 1
        except OSError:
            pass
    return {"ok": not ours, "ours_left": ours[:20], "ours_left_count": len(ours),
            "removed_after_check": removed, "before": len(before), "after": len(after)}


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------

def aggregate(clients: List[Client]) -> Dict[str, Any]:
    """The clients' results, summed: operations per kind per uid, statuses per operation,
    errors and findings by kind, traces."""
    ops_per_uid: Dict[str, Dict[str, int]] = {}
    outcomes: Dict[str, Dict[str, int]] = {}
    errors: Dict[str, int] = {}
    findings: Dict[str, int] = {}
    out_writes = {"ok": 0, "failed": 0, "bind_failed": 0}
    dump_samples: Dict[str, str] = {}
    setuid = {"refused": 0, "allowed": 0, "untestable": 0}
    traces, stale, per_client = [], [], []
    trace_count = stale_count = 0
    samples: List[str] = []
    finding_samples: List[str] = []
    for client in clients:
        result = client.result() or {}
        per_uid = ops_per_uid.setdefault(str(client.uid), {})
        for op, n in result.get("ops", {}).items():
            count_by(per_uid, op, n)
        for op, statuses in result.get("outcomes", {}).items():
            for status, n in statuses.items():
                count_by(outcomes.setdefault(op, {}), status, n)
        for kind, n in result.get("errors", {}).items():
            count_by(errors, kind, n)
        for kind, n in result.get("findings", {}).items():
            count_by(findings, kind, n)
        for key in out_writes:
            out_writes[key] += result.get("out_writes", {}).get(key, 0)
        for key in setuid:
            setuid[key] += result.get("setuid", {}).get(key, 0)
        for key, text in result.get("dump_samples", {}).items():
            dump_samples.setdefault(key, f"client {client.client_id} (uid {client.uid}):\n{text}")
        trace_count += result.get("trace_count", 0)
        stale_count += result.get("stale_count", 0)
        traces += [dict(t, client=client.client_id) for t in result.get("traces", [])]
        stale += [dict(t, client=client.client_id) for t in result.get("stale", [])]
        samples += [f"client {client.client_id}: {s}" for s in result.get("error_samples", [])]
        finding_samples += [f"client {client.client_id}: {s}"
                            for s in result.get("finding_samples", [])]
        per_client.append({"client_id": client.client_id, "uid": client.uid,
                           "reported": bool(result), "hung": client.hung,
                           "exit": client.proc.returncode if client.proc else None,
                           "ops": sum(result.get("ops", {}).values()),
                           "clean": result.get("clean", {}), "errors": result.get("errors", {})})
    return {"ops_per_uid": ops_per_uid, "outcomes": outcomes, "errors": errors,
            "error_samples": samples[:40], "findings": findings,
            "finding_samples": finding_samples[:40], "out_writes": out_writes, "setuid": setuid,
            "dump_samples": dump_samples,
            "traces": {"cross_client": trace_count, "stale": stale_count,
                       "cross_client_samples": traces[:20], "stale_samples": stale[:20]},
            "clients": per_client}


def make_checks(report: Dict[str, Any], args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The verdicts: (name, held, detail) for each thing the soak promises."""
    checks: List[Dict[str, Any]] = []

    def check(name: str, held: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(held), "detail": detail})

    clients = report["clients"]
    server = report["server"]
    check("server stayed up", server.get("alive_at_deadline", False)
          and server.get("hello_pid") == server.get("pid"),
          f"pid {server.get('pid')}, hello's {server.get('hello_pid')}, alive at the "
          f"deadline: {server.get('alive_at_deadline')}, hello at the end: "
          f"{server.get('hello_at_end')}")
    silent = [c["client_id"] for c in clients if not c["reported"] or c["hung"]]
    check("every client finished and reported", not silent,
          f"hung or silent: {silent}" if silent else f"{len(clients)} clients")
    idle = [c["client_id"] for c in clients
            if not c["clean"].get("run_dump") or not c["clean"].get("session_dump")]
    check("every client completed a dump run and a dump session", not idle,
          f"clients without: {idle}" if idle else "all did")
    traces = report["traces"]
    check("no cross-client trace", traces["cross_client"] == 0,
          f"{traces['cross_client']} traces")
    check("no stale trace of an earlier operation", traces["stale"] == 0,
          f"{traces['stale']} stale marks")
    check("set-id bits refused inside", report["setuid"]["allowed"] == 0,
          f"{report['setuid']}")
    # Without a writable /out the set-id test and the out-dir check prove nothing.
    check("/out writable: the set-id test ran", report["setuid"]["refused"] > 0,
          f"{report['setuid']['refused']} set-id attempts tested, /out writes "
          f"{report['out_writes']}")
    rss = server.get("rss_mib", {}).get("max")
    check(f"server RSS max <= {args.max_rss_mib} MiB",
          rss is not None and rss <= args.max_rss_mib, f"{server.get('rss_mib')}")
    fds = server.get("fds", {}).get("max")
    check(f"server fds max <= {args.max_fds}", fds is not None and fds <= args.max_fds,
          f"{server.get('fds')}")
    stop = server.get("stop", {})
    check("server stopped on SIGTERM, socket removed",
          stop.get("exited_in_time", False) and not stop.get("socket_left", True), f"{stop}")
    leaks = report["leaks"]
    check("out dirs: the client's uid only, no set-id bit", leaks["out_dirs"]["ok"],
          f"{leaks['out_dirs']['entries']} entries, "
          f"{leaks['out_dirs']['problem_count']} problems")
    check("no process left (sandbox uids, tokens)", leaks["processes"]["ok"],
          f"{len(leaks['processes']['sandbox_uid_processes'])} sandbox-uid, "
          f"{len(leaks['processes']['token_processes'])} with a token")
    check("no cgroup of this server left", leaks["cgroups"]["ok"],
          f"{leaks['cgroups']['ours_left_count']} left")
    return checks


def print_summary(report: Dict[str, Any]) -> None:
    server = report["server"]
    total = sum(sum(ops.values()) for ops in report["ops_per_uid"].values())
    print(f"soak: {report['clients_count']} clients of uids {report['uids']} for "
          f"{report['duration_s']} s through one server (pid {server.get('pid')}), seed "
          f"{report['seed']}")
    print(f"operations: {total} ({total / max(report['duration_s'], 1e-9):.1f}/s); per uid:")
    for uid, ops in sorted(report["ops_per_uid"].items(), key=lambda kv: int(kv[0])):
        print(f"  uid {uid}: {sum(ops.values())} "
              f"({', '.join(f'{k} {v}' for k, v in sorted(ops.items()))})")
    print("outcomes:")
    for op, statuses in sorted(report["outcomes"].items()):
        print(f"  {op}: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}")
    print(f"errors by kind: {report['errors'] or 'none'}")
    for sample in report["error_samples"][:8]:
        print(f"  {sample.splitlines()[0][:200]}")
    print(f"findings: {report['findings'] or 'none'}")
    for sample in report["finding_samples"][:6]:
        print(f"  {sample.splitlines()[0][:200]}")
    print(f"/out writes: {report['out_writes']}; chmod of set-id bits: {report['setuid']}")
    traces = report["traces"]
    print(f"traces: {traces['cross_client']} cross-client, {traces['stale']} stale")
    for sample in traces["cross_client_samples"][:5] + traces["stale_samples"][:5]:
        print(f"  client {sample['client']} {sample['op']} saw {sample['seen']}: "
              f"{sample['context'][:200]}")
    for key, unit in (("rss_mib", " MiB"), ("fds", ""), ("threads", "")):
        if key in server:
            v = server[key]
            print(f"server {key.split('_')[0]}: start {v['start']}{unit}, max {v['max']}{unit}, "
                  f"end {v['end']}{unit}")
    if server.get("pools_at_end"):
        print(f"server pools at the end: {server['pools_at_end']}")
    leaks = report["leaks"]
    for line in (leaks["out_dirs"]["problems"][:5] + leaks["processes"]["sandbox_uid_processes"][:5]
                 + leaks["processes"]["token_processes"][:5] + leaks["cgroups"]["ours_left"][:5]):
        print(f"  left behind: {line[:200]}")
    print("checks:")
    for check in report["checks"]:
        print(f"  [{'ok' if check['ok'] else 'FAILED'}] {check['name']}: {check['detail']}")


# ------------------------------------------------------------------------------------------------
# The coordinator's main
# ------------------------------------------------------------------------------------------------

def stop_server(server: subprocess.Popen, socket_path: str) -> Dict[str, Any]:
    """SIGTERM, then up to 60 s for the exit (then SIGKILL to its group)."""
    result: Dict[str, Any] = {"already_exited": server.poll() is not None}
    started = time.monotonic()
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
        result["exited_in_time"] = not result["already_exited"]
    except subprocess.TimeoutExpired:
        result["exited_in_time"] = False
        kill_group(server)
        server.wait()
    result["seconds"] = round(time.monotonic() - started, 2)
    result["status"] = server.returncode
    result["socket_left"] = os.path.exists(socket_path)
    return result


def soak(args: argparse.Namespace, root: str, state: Dict[str, Any]) -> Dict[str, Any]:
    """Everything between making the directories and the report; `state` holds what the caller's
    cleanup must stop (the server, the clients) whatever happens here."""
    binary = os.path.join(args.bin, "rlm-sandbox")
    socket_path = os.path.join(root, "server.sock")
    uid_dirs, clients = make_dirs(root, args.clients)
    state["clients"] = clients
    cgroups_before = cgroup_dirs()
    boot_ticks = proc_start_ticks(os.getpid()) or 0
    server_log = open(os.path.join(root, "logs", "server.log"), "wb")
    state["server_log"] = server_log
    server = start_server(binary, root, uid_dirs, args, server_log)
    state["server"] = server
    server_ticks = proc_start_ticks(server.pid)
    hello = wait_for_server(socket_path, server, args.python_dir, 120)
    monitor = ServerMonitor(server.pid, args.sample_seconds)
    monitor.sample()
    monitor.start()
    state["monitor"] = monitor

    started = time.time()
    deadline = started + args.seconds
    for client in clients:
        start_client(client, args, root, deadline)
    alive_at_deadline = True
    while time.time() < deadline:
        if server.poll() is not None:
            alive_at_deadline = False
            print(f"soak: the server exited with status {server.returncode} during the soak",
                  file=sys.stderr)
            break
        time.sleep(min(1.0, max(0.0, deadline - time.time())))
    if alive_at_deadline:
        wait_clients(clients, deadline + CLIENT_GRACE_SECONDS)
    else:  # they would only count refusals until the deadline: stop them now
        wait_clients(clients, time.time(), count_hung=False)
    duration = time.time() - started
    # The end sample once the pools have had a moment to refill and idle connections to close:
    # what the server holds at rest after the load, comparable with the start.
    time.sleep(3)
    alive_at_deadline = alive_at_deadline and server.poll() is None
    hello_end = server_hello(socket_path) if server.poll() is None else None
    monitor.sample()
    monitor.stop_event.set()
    monitor.join()
    stop = stop_server(server, socket_path)

    tokens = [client.token for client in clients]
    leaks = {"out_dirs": check_out_dirs(clients),
             "processes": check_processes(tokens, server.pid, server_ticks or boot_ticks),
             "cgroups": check_cgroups(server.pid, server_ticks, cgroups_before)}
    report = aggregate(clients)
    server_report = {"pid": server.pid, "hello_pid": hello.get("pid"),
                     "alive_at_deadline": alive_at_deadline, "hello_at_end": hello_end is not None,
                     "pools_at_end": (hello_end or {}).get("pools"), "stop": stop,
                     **monitor.summary()}
    report.update({"duration_s": round(duration, 1), "seconds_requested": args.seconds,
                   "clients_count": len(clients), "seed": args.seed,
                   "uids": sorted({c.uid for c in clients}), "server": server_report,
                   "leaks": leaks, "bounds": {"max_rss_mib": args.max_rss_mib,
                                              "max_fds": args.max_fds}})
    report["checks"] = make_checks(report, args)
    report["passed"] = sum(1 for c in report["checks"] if c["ok"])
    report["failed"] = len(report["checks"]) - report["passed"]
    if report["failed"]:
        report["server_log_tail"] = tail(os.path.join(root, "logs", "server.log"))
        report["client_log_tails"] = {c.client_id: c.log_tail() for c in clients
                                      if not c.result() or c.hung or (c.proc and c.proc.returncode)}
    return report


def wait_clients(clients: List[Client], until: float, count_hung: bool = True) -> None:
    """Waits for every client until `until` (wall clock); kills the group of any still running
    then (counted as hung, with `count_hung`) and reaps it."""
    for client in clients:
        if client.proc is None:
            continue
        try:
            client.proc.wait(timeout=max(0.0, until - time.time()))
        except subprocess.TimeoutExpired:
            client.hung = count_hung
            kill_group(client.proc)  # still running, so its group is still its own
            client.proc.wait()


def tail(path: str, size: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def cleanup(state: Dict[str, Any], root: str, keep: bool) -> None:
    """Stops whatever is still running (clients first, then the server) and removes the
    directory: runs on every way out, Ctrl-C included."""
    for client in state.get("clients", []):
        if client.proc is not None and client.proc.poll() is None:
            kill_group(client.proc)
            client.proc.wait()
    monitor = state.get("monitor")
    if monitor is not None:
        monitor.stop_event.set()
    server = state.get("server")
    if server is not None and server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(server)
            server.wait()
    if state.get("server_log") is not None:
        state["server_log"].close()
    if keep:
        print(f"soak: kept {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


def coordinator_main(args: argparse.Namespace) -> int:
    binary = os.path.join(args.bin, "rlm-sandbox")
    missing = [p for p in (binary, os.path.join(args.bin, "rlm-sandbox-init"))
               if not os.access(p, os.X_OK)]
    args.python = args.python or client_python()
    why = ("the clients run as other uids: run as root" if os.geteuid() != 0 else
           f"no {', '.join(missing)}" if missing else
           "no python3 every uid can run (give --python)" if not args.python else
           f"{args.python_dir} is not readable by every uid" if not reachable_by_all(
               os.path.join(args.python_dir, "rlm_sandbox", "server.py"), read=True) else None)
    if why:
        print(f"{SKIP_MARK}: {why}\nsoak: 0 passed, 0 failed")
        return SKIP

    def terminate(signum, frame):  # SIGTERM/SIGHUP: unwind through the cleanup as Ctrl-C does
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    root = tempfile.mkdtemp(prefix="rlm-soak-tenants-")
    state: Dict[str, Any] = {}
    try:
        report = soak(args, root, state)
    except KeyboardInterrupt:
        print("soak: interrupted; stopping the clients and the server", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the harness failed: say so, fail, clean up
        traceback.print_exc()
        print(f"soak: the harness failed: {error}\n{tail(os.path.join(root, 'logs', 'server.log'))}"
              f"\nsoak: 0 passed, 1 failed")
        return 1
    finally:
        cleanup(state, root, args.keep)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    print_summary(report)
    print(f"soak: {report['passed']} passed, {report['failed']} failed")
    return 0 if report["failed"] == 0 else 1


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Multi-tenant soak of rlm-sandbox serve: clients of several uids share one "
                    "server; checks traces, leaks, the server's memory and fds.")
    parser.add_argument("--bin", help="the build's bin/ (rlm-sandbox, rlm-sandbox-init)")
    parser.add_argument("--seconds", type=float, default=60, help="how long the clients run")
    parser.add_argument("--clients", type=int, default=8, help="client processes (default 8)")
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--max-rss-mib", type=float, default=512,
                        help="the bound on the server's VmRSS (default 512)")
    parser.add_argument("--max-fds", type=int, default=1024,
                        help="the bound on the server's open fds (default 1024)")
    parser.add_argument("--sample-seconds", type=float, default=5, help="monitor interval")
    parser.add_argument("--pool", type=int, default=4, help="warm run sandboxes (default 4)")
    parser.add_argument("--session-pool", type=int, default=2,
                        help="warm python-repl sessions (default 2)")
    parser.add_argument("--seed", type=int, default=None, help="the random mix's seed")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--python", default=None,
                        help="the interpreter of the clients (default: this one if every uid "
                             "can run it, else python3 in /usr/local/bin, /usr/bin, /bin)")
    parser.add_argument("--python-dir", default=os.path.join(repo_root(), "python"),
                        help="where the rlm_sandbox package is (default: the source tree's)")
    # The client mode (started by the coordinator, never by hand).
    client = parser.add_argument_group("client mode (internal)")
    client.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    client.add_argument("--client-id", type=int, help=argparse.SUPPRESS)
    client.add_argument("--token", help=argparse.SUPPRESS)
    client.add_argument("--socket", help=argparse.SUPPRESS)
    client.add_argument("--out-dir", help=argparse.SUPPRESS)
    client.add_argument("--result", help=argparse.SUPPRESS)
    client.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    client.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    if not args.client and not args.bin:
        parser.error("--bin is required")
    if not args.client and args.clients < 1:
        parser.error("--clients must be at least 1")
    args.python_dir = os.path.abspath(args.python_dir)
    if args.bin:
        args.bin = os.path.abspath(args.bin)
    return args


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    if args.client:
        return client_main(args)
    return coordinator_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
