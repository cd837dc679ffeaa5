"""Tests for the rlm_sandbox client package (python/rlm_sandbox/) against the real ``rlm-sandbox``
binary.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_rlm_sandbox_client``
from tests/python_client (ctest's ``python_client`` test does this). Most tests use the namespace
backend with the default python-repl policy, which needs root or unprivileged user namespaces.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from unittest import mock
from typing import Any, Dict, List, Optional, Set

# The package under test is the repository's, not one installed elsewhere.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import rlm_sandbox  # noqa: E402
import rlm_sandbox._fork  # noqa: E402
from rlm_sandbox import MAX_LINE_BYTES, CellResult, RlmSandbox, RlmSandboxError  # noqa: E402

BINARY = os.environ.get("RLM_SANDBOX_BIN") or shutil.which("rlm-sandbox")
BACKEND = "namespace"


def setUpModule() -> None:  # noqa: N802 - unittest's name
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")
    if not os.access(BINARY, os.X_OK):
        raise RuntimeError(f"RLM_SANDBOX_BIN={BINARY}: not an executable file")


def _descendants(root: int, skip: Optional[int] = None) -> Set[int]:
    """Pids of every live process below `root` (by /proc's parent links), but `skip` and the
    processes below it (one reading of /proc for both)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z":  # a zombie is already gone, only not reaped yet
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: Set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and child != skip:
                found.add(child)
                stack.append(child)
    return found


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    # Every test closes its sandboxes: nothing this process started may still run.
    deadline = time.monotonic() + 5.0
    while _descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _descendants(os.getpid())
    if left:
        raise AssertionError(f"processes left behind: {sorted(left)}")


class ConcurrencyMeter:
    """An LM callback that answers after `delay` seconds, counting how many run at once."""

    def __init__(self, delay: float, answer: Any = None) -> None:
        self.delay = delay
        self.answer = answer if answer is not None else (lambda prompt: prompt)
        self.most = 0
        self._now = 0
        self._lock = threading.Lock()

    def __call__(self, prompt: Any, model: Optional[str]) -> str:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        try:
            time.sleep(self.delay)
            return self.answer(prompt)
        finally:
            with self._lock:
                self._now -= 1


class SandboxTestCase(unittest.TestCase):
    def sandbox(self, **options: Any) -> RlmSandbox:
        """A sandbox on the test backend, closed (or killed) when the test ends."""
        options.setdefault("backend", BACKEND)
        options.setdefault("binary", BINARY)
        sandbox = RlmSandbox(**options)
        self.addCleanup(self._dispose, sandbox)
        return sandbox

    @staticmethod
    def _dispose(sandbox: RlmSandbox) -> None:
        try:
            sandbox.close()
        except RlmSandboxError:
            sandbox._kill()

    def run_ok(self, sandbox: RlmSandbox, code: str, **options: Any) -> CellResult:
        result = sandbox.execute(code, **options)
        self.assertEqual(result.status, "ok", result)
        return result


class StateTest(SandboxTestCase):
    def test_state_persists_across_cells(self) -> None:
        sb = self.sandbox()
        self.assertEqual(sb.backend, "namespace")
        self.assertEqual(sb.policy, "python-repl")
        self.assertTrue(self.run_ok(sb, "x = 41").ok)
        result = self.run_ok(sb, "x + 1")
        self.assertEqual(result.stdout, "42\n")
        self.assertFalse(result.has_final)
        self.assertFalse(result.rolled_back)

    def test_python_exception_is_an_error_result(self) -> None:
        sb = self.sandbox()
        result = sb.execute("y = 1\n1 / 0")
        self.assertEqual(result.status, "error")
        self.assertFalse(result.ok)
        self.assertIn("ZeroDivisionError", result.error)
        self.assertEqual(self.run_ok(sb, "print(y)").stdout, "1\n")

    def test_final_and_final_var(self) -> None:
        sb = self.sandbox()
        result = self.run_ok(sb, "FINAL('done')")
        self.assertTrue(result.has_final)
        self.assertEqual(result.final, "done")
        result = self.run_ok(sb, "answer = {'k': [1, 2], 'n': None}\nFINAL_VAR('answer')")
        self.assertTrue(result.has_final)
        self.assertEqual(result.final, {"k": [1, 2], "n": None})
        result = self.run_ok(sb, "FINAL(None)")
        self.assertTrue(result.has_final)
        self.assertIsNone(result.final)

    def test_timeout_is_rolled_back(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 1")
        started = time.monotonic()
        result = sb.execute("x = 2\nwhile True:\n    pass", timeout=1)
        self.assertLess(time.monotonic() - started, 15)
        self.assertEqual(result.status, "timeout")
        self.assertTrue(result.rolled_back)
        self.assertFalse(result.ok)
        self.assertEqual(self.run_ok(sb, "print(x)").stdout, "1\n")

    def test_memory_limit_is_rolled_back(self) -> None:
        sb = self.sandbox(memory=128 * 1024 * 1024)
        self.run_ok(sb, "keep = 7")
        result = sb.execute("big = bytearray(400 * 1024 * 1024)")
        self.assertEqual(result.status, "memory_limit")
        self.assertTrue(result.rolled_back)
        self.assertEqual(self.run_ok(sb, "keep").stdout, "7\n")

    def test_snapshot_and_restore(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 1")
        snapshot = sb.snapshot()
        self.assertIsInstance(snapshot, int)
        self.run_ok(sb, "x = 2")
        sb.restore(snapshot)
        self.assertEqual(self.run_ok(sb, "x").stdout, "1\n")
        self.run_ok(sb, "x = 3")
        sb.restore(snapshot)  # a snapshot can be restored again
        self.assertEqual(self.run_ok(sb, "x").stdout, "1\n")
        with self.assertRaises(RlmSandboxError):
            sb.restore(snapshot + 1000)
        self.assertEqual(self.run_ok(sb, "x").stdout, "1\n")

    def test_refused_request_raises_and_session_goes_on(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 5")
        with self.assertRaisesRegex(RlmSandboxError, "above the policy's"):
            sb.execute("x", timeout=3600)  # above the policy's 60 s
        self.assertEqual(self.run_ok(sb, "x").stdout, "5\n")

    def test_narrow_network_narrows_a_live_allowlist(self) -> None:
        # The sandbox's DNS is answered on the host side: an allowed name resolves (to an
        # address the host side bound to it) with no upstream at all, and not once narrowed away.
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as policy:
            json.dump({"extends": "python-repl",
                       "network": {"allow": ["pypi.test:443", "files.test:443"]}}, policy)
        self.addCleanup(os.unlink, policy.name)
        sb = self.sandbox(policy=policy.name)
        lookup = ("import socket\n"
                  "def lookup(name):\n"
                  "    try: return socket.gethostbyname(name).startswith('198.1')\n"
                  "    except OSError as error: return type(error).__name__\n")
        self.run_ok(sb, lookup)
        self.assertEqual(self.run_ok(sb, "print(lookup('files.test'))").stdout, "True\n")
        sb.narrow_network(["pypi.test:443"])
        self.assertEqual(self.run_ok(sb, "print(lookup('files.test'), lookup('pypi.test'))").stdout,
                         "gaierror True\n")
        with self.assertRaisesRegex(RlmSandboxError, "not within"):
            sb.narrow_network(["files.test:443"])  # never wider than the list is now
        with self.assertRaises(TypeError):
            sb.narrow_network("pypi.test:443")  # type: ignore[arg-type]
        sb.narrow_network([])
        self.assertEqual(self.run_ok(sb, "print(lookup('pypi.test'))").stdout, "gaierror\n")

    def test_narrow_network_without_an_allowlist_raises(self) -> None:
        sb = self.sandbox()
        with self.assertRaisesRegex(RlmSandboxError, "no egress allowlist"):
            sb.narrow_network(["pypi.test:443"])
        self.assertEqual(self.run_ok(sb, "print(1)").stdout, "1\n")

    def test_trusted_local_policy_on_local_backend(self) -> None:
        sb = self.sandbox(policy="trusted-local", backend="local")
        self.assertEqual(sb.backend, "local")
        self.assertEqual(sb.policy, "trusted-local")
        self.run_ok(sb, "x = 41")
        self.assertEqual(self.run_ok(sb, "x + 1").stdout, "42\n")
        self.assertEqual(sb.close()["backend"], "local")


#: A session's state of each kind a save keeps (a variable, a function and a class defined in
#: cells, an instance, a module, a file under /tmp), and a generator, which it cannot keep.
SAVED_STATE_CELL = textwrap.dedent("""\
    x = 41
    def plus_x(a):
        return a + x
    class Point:
        def __init__(self, y):
            self.y = y
        def norm(self):
            return abs(self.y)
    p = Point(-3)
    import json
    numbers = (i for i in range(3))
    with open('/tmp/notes.txt', 'w') as out:
        out.write('kept')
    del out
    """)
#: What a session holding SAVED_STATE_CELL's state (and context "ctx") prints for this cell.
SAVED_STATE_CHECK = ("print(x, plus_x(1), p.norm(), json.dumps([1]), open('/tmp/notes.txt').read(),"
                     " context, 'numbers' in globals())")
SAVED_STATE_OUTPUT = "41 42 3 [1] kept ctx False\n"
#: A variable that pickles alone but not with the others (its __reduce__ fails on the 1st and
#: 3rd call): the save fails as a whole, with status error.
UNSAVEABLE_CELL = textwrap.dedent("""\
    class Flaky:
        calls = 0
        def __reduce__(self):
            Flaky.calls += 1
            if Flaky.calls != 2:
                raise ValueError('flaky')
            return (Flaky, ())
    flaky = Flaky()
    """)


def tampered_copy(path: str) -> str:
    """A copy of the save file at `path` with one bit of its middle byte flipped."""
    with open(path, "rb") as original:
        data = bytearray(original.read())
    data[len(data) // 2] ^= 0x01
    copy = path + ".tampered"
    with open(copy, "wb") as out:
        out.write(data)
    return copy


class SaveLoadTest(SandboxTestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlm-save-load-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "run.save")

    def saved_session(self) -> RlmSandbox:
        sb = self.sandbox(context="ctx")
        self.run_ok(sb, SAVED_STATE_CELL)
        result = sb.save(self.path)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.saved["bytes"], os.path.getsize(self.path))
        self.assertEqual([(item["name"], item["type"]) for item in result.saved["skipped"]],
                         [("numbers", "generator")])
        return sb

    def test_state_round_trips_into_a_fresh_sandbox(self) -> None:
        self.saved_session()
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)
        self.assertEqual(os.listdir(self.dir), ["run.save"])
        fresh = self.sandbox()
        self.assertEqual(self.run_ok(fresh, "y = 1").saved, None)
        result = fresh.load(self.path)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(self.run_ok(fresh, SAVED_STATE_CHECK).stdout, SAVED_STATE_OUTPUT)
        self.assertIn("NameError", fresh.execute("y").error)  # load replaced the state

    def test_a_relative_path_is_the_callers(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 5")
        cwd = os.getcwd()
        os.chdir(self.dir)
        try:
            self.assertTrue(sb.save("relative.save").ok)
            self.assertTrue(sb.load("relative.save").ok)
        finally:
            os.chdir(cwd)
        self.assertTrue(os.path.isfile(os.path.join(self.dir, "relative.save")))

    def test_restore_from_opens_a_sandbox_holding_the_state(self) -> None:
        self.saved_session()
        restored = RlmSandbox.restore_from(self.path, backend=BACKEND, binary=BINARY)
        self.addCleanup(self._dispose, restored)
        self.assertEqual(self.run_ok(restored, SAVED_STATE_CHECK).stdout, SAVED_STATE_OUTPUT)

    def test_a_tampered_file_is_refused_and_the_session_goes_on(self) -> None:
        self.saved_session()
        tampered = tampered_copy(self.path)
        sb = self.sandbox()
        self.run_ok(sb, "x = 'mine'")
        with self.assertRaisesRegex(RlmSandboxError, "SHA-256"):
            sb.load(tampered)
        self.assertEqual(self.run_ok(sb, "print(x)").stdout, "mine\n")
        with self.assertRaisesRegex(RlmSandboxError, "cannot open the save file"):
            sb.load(os.path.join(self.dir, "missing.save"))

    def test_restore_from_a_tampered_file_closes_the_new_sandbox(self) -> None:
        self.saved_session().close()  # its sandbox forks standbys of its own meanwhile
        tampered = tampered_copy(self.path)
        closed: List[RlmSandbox] = []
        real_close = RlmSandbox.close

        def recorded_close(sandbox: RlmSandbox) -> Dict[str, Any]:
            closed.append(sandbox)
            return real_close(sandbox)

        before = _descendants(os.getpid())
        with mock.patch.object(RlmSandbox, "close", recorded_close), \
                self.assertRaisesRegex(RlmSandboxError, "SHA-256"):
            RlmSandbox.restore_from(tampered, backend=BACKEND, binary=BINARY)
        self.assertEqual(len(closed), 1)
        self.assertFalse(closed[0].running)
        self.assertEqual(_descendants(os.getpid()) - before, set())

    def test_a_failed_save_leaves_no_partial_file_and_the_old_file_as_it_was(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 1")
        self.assertTrue(sb.save(self.path).ok)
        with open(self.path, "rb") as good:
            before = good.read()
        self.run_ok(sb, UNSAVEABLE_CELL)
        result = sb.save(self.path)
        self.assertEqual(result.status, "error", result)
        self.assertIn("cannot be saved together", result.error)
        self.assertIsNone(result.saved)
        self.assertEqual(os.listdir(self.dir), ["run.save"])
        with open(self.path, "rb") as kept:
            self.assertEqual(kept.read(), before)
        with self.assertRaises(RlmSandboxError):
            sb.save(os.path.join(self.dir, "no-such-dir", "run.save"))
        self.assertEqual(os.listdir(self.dir), ["run.save"])
        self.assertEqual(self.run_ok(sb, "print(x)").stdout, "1\n")


#: A parent's state for the fork tests: SAVED_STATE_CELL's, a working directory under /tmp
#: holding a file, and a generator of its own seeded (a variable: saved with its state).
FORK_CELL = SAVED_STATE_CELL + textwrap.dedent("""\
    import os, random
    os.makedirs('/tmp/work', exist_ok=True)
    os.chdir('/tmp/work')
    with open('shared.txt', 'w') as out:
        out.write('parent')
    del out
    generator = random.Random(1)
    generator.random()
    """)
#: What a branch of that parent (with context_1 "second" and history_0 added) prints.
FORK_CHECK = (SAVED_STATE_CHECK + "\nprint(os.getcwd(), open('shared.txt').read(), context_1, "
              "history[0]['content'])")
FORK_OUTPUT = SAVED_STATE_OUTPUT + "/tmp/work parent second hi\n"
#: Where a cell runs: its sandbox's PID and mount namespaces.
WHERE_CODE = "print(os.readlink('/proc/self/ns/pid'), os.readlink('/proc/self/ns/mnt'))"


class ForkChecks:
    """fork(n)'s contract, whatever the client: the test case's make_parent(**options) opens a
    session (closed when the test ends); branch_class is the class of the sessions a fork opens
    and loads. Each test runs with tempfile's directory a private one, to see what a fork
    leaves there."""

    branch_class: type = RlmSandbox

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.temp = tempfile.mkdtemp(prefix="rlm-fork-test-")
        self.addCleanup(shutil.rmtree, self.temp, True)
        patcher = mock.patch.object(tempfile, "tempdir", self.temp)
        patcher.start()
        self.addCleanup(patcher.stop)

    def make_parent(self, **options: Any) -> Any:
        raise NotImplementedError

    def processes(self, parent: Any) -> Set[int]:
        """This process's descendants outside `parent`'s sandbox (none to count: empty)."""
        return set()

    @staticmethod
    def fork_dirs() -> List[str]:
        return [name for name in os.listdir(tempfile.gettempdir())
                if name.startswith(rlm_sandbox._fork.TEMP_PREFIX)]

    @staticmethod
    def dispose(session: Any) -> None:
        try:
            session.close()
        except Exception:  # noqa: BLE001
            if isinstance(session, RlmSandbox):
                session._kill()

    def output(self, session: Any, code: str) -> str:
        result = session.execute(code)
        self.assertEqual(result.status, "ok", result)
        return result.stdout

    def parent_with_state(self) -> Any:
        parent = self.make_parent(context="ctx")
        self.output(parent, FORK_CELL)
        self.assertEqual(parent.add_context("second"), 1)
        self.assertEqual(parent.add_history([{"role": "user", "content": "hi"}]), 0)
        return parent

    def fork(self, parent: Any, n: int) -> List[Any]:
        branches = parent.fork(n)
        for branch in branches:
            self.addCleanup(self.dispose, branch)
        self.assertEqual(len(branches), n)
        self.assertEqual(self.fork_dirs(), [])
        return branches

    def test_branches_of_one_and_of_three_hold_the_parents_state(self) -> None:
        parent = self.parent_with_state()
        places = {self.output(parent, WHERE_CODE)}
        for n in (1, 3):
            for branch in self.fork(parent, n):
                self.assertIsInstance(branch, type(parent))
                self.assertEqual(self.output(branch, FORK_CHECK), FORK_OUTPUT)
                places.add(self.output(branch, WHERE_CODE))
        self.assertEqual(len(places), 5, places)  # each branch in a sandbox of its own
        # The parent goes on unchanged (with the generator a save does not keep).
        self.assertEqual(self.output(parent, "print(x, next(numbers), os.getcwd(), context)"),
                         "41 0 /tmp/work ctx\n")

    def test_what_a_branch_writes_no_other_session_sees(self) -> None:
        parent = self.parent_with_state()
        branches = self.fork(parent, 3)
        for index, branch in enumerate(branches):
            self.output(branch, f"x = 'branch {index}'\nopen('shared.txt', 'w').write(x)\n"
                                f"open('/tmp/only-{index}', 'w').close()")
            self.assertEqual(branch.add_context(f"of branch {index}"), 2)
        check = ("print(x, open('shared.txt').read(), "
                 "sorted(n for n in os.listdir('/tmp') if n.startswith('only-')), "
                 "globals().get('context_2'))")
        for index, branch in enumerate(branches):
            self.assertEqual(self.output(branch, check),
                             f"branch {index} branch {index} ['only-{index}'] "
                             f"of branch {index}\n")
        self.assertEqual(self.output(parent, check), "41 parent [] None\n")

    def test_random_is_seeded_anew_in_each_branch(self) -> None:
        parent = self.parent_with_state()
        branches = self.fork(parent, 3)
        draw = "print(random.random(), generator.random())"
        draws = [self.output(session, draw).split() for session in [parent, *branches]]
        # The module's generator differs in every session; a Random the cells keep is a
        # variable like any other, its state carried to every branch.
        self.assertEqual(len({module for module, _ in draws}), 4, draws)
        expected = random.Random(1)
        expected.random()
        self.assertEqual({kept for _, kept in draws}, {str(expected.random())})

    def test_branches_live_on_without_the_parent_and_fork_in_turn(self) -> None:
        parent = self.parent_with_state()
        first, second = self.fork(parent, 2)
        parent.close()
        with self.assertRaises(RlmSandboxError):
            parent.execute("1")
        self.assertEqual(self.output(first, "x += 1\nprint(x)"), "42\n")
        first.close()
        self.assertEqual(self.output(second, "x += 10\nprint(x)"), "51\n")
        (grandchild,) = self.fork(second, 1)
        self.assertEqual(self.output(grandchild, "print(x, context_1, open('shared.txt').read())"),
                         "51 second parent\n")

    def test_a_count_outside_1_to_64_is_refused(self) -> None:
        parent = self.make_parent()
        self.output(parent, "x = 1")
        before = self.processes(parent)
        for count in (0, 65, -1, True, 2.5, "3", None):
            with self.assertRaises(ValueError):
                parent.fork(count)
        self.assertEqual(rlm_sandbox._fork.checked_count(64), 64)
        self.assertEqual(self.processes(parent) - before, set())
        self.assertEqual(self.fork_dirs(), [])
        self.assertEqual(self.output(parent, "print(x)"), "1\n")

    def test_a_state_that_cannot_be_saved_opens_no_branch(self) -> None:
        parent = self.make_parent()
        self.output(parent, "x = 1\n" + UNSAVEABLE_CELL)
        before = self.processes(parent)
        with self.assertRaisesRegex(RlmSandboxError, "could not be saved for the fork: error: "
                                    ".*cannot be saved together"):
            parent.fork(2)
        self.assertEqual(self.processes(parent) - before, set())
        self.assertEqual(self.fork_dirs(), [])
        self.assertEqual(self.output(parent, "print(x)"), "1\n")

    def test_a_failed_branch_closes_every_branch_and_is_named(self) -> None:
        parent = self.parent_with_state()
        real_load = self.branch_class.load
        loads: List[Any] = []
        lock = threading.Lock()

        def load(branch: Any, path: str) -> CellResult:
            with lock:
                loads.append(branch)
                turn = len(loads)
            if turn == 2:
                raise RlmSandboxError("no room for this branch")
            return real_load(branch, path)

        before = self.processes(parent)
        with mock.patch.object(self.branch_class, "load", load), \
                self.assertRaisesRegex(RlmSandboxError,
                                       r"^1 of the fork's 3 branches failed \(the branches "
                                       r"opened were closed\): branch [0-2]: no room for this "
                                       r"branch$"):
            parent.fork(3)
        self.assertEqual(len(loads), 3)
        self.assertEqual([branch.running for branch in loads], [False] * 3)
        self.assertEqual(self.processes(parent) - before, set())
        self.assertEqual(self.fork_dirs(), [])
        self.assertEqual(self.output(parent, "print(x)"), "41\n")


class ForkTest(ForkChecks, SandboxTestCase):
    """RlmSandbox.fork through the repl: each branch is an ``rlm-sandbox repl`` process."""

    def make_parent(self, **options: Any) -> RlmSandbox:
        return self.sandbox(**options)

    def processes(self, parent: Any) -> Set[int]:
        # The parent's sandbox may start and end processes of its own meanwhile (standbys).
        return _descendants(os.getpid(), skip=parent.pid)

    def test_branches_open_with_the_parents_arguments_but_the_context(self) -> None:
        parent = self.sandbox(context="ctx", timeout=2, echo=False,
                              tools={"double": lambda v: 2 * v},
                              on_llm_query=lambda prompt, model: f"first:{prompt}")
        self.run_ok(parent, "x = 21")
        parent.on_llm_query = lambda prompt, model: f"now:{prompt}"  # as the parent answers now
        opened: List[Dict[str, Any]] = []
        real_init = RlmSandbox.__init__

        def init(sandbox: RlmSandbox, *args: Any, **kwargs: Any) -> None:
            opened.append(kwargs)
            real_init(sandbox, *args, **kwargs)

        with mock.patch.object(RlmSandbox, "__init__", init):
            branches = self.fork(parent, 2)
        self.assertEqual(len(opened), 2)
        for kwargs in opened:
            self.assertIsNone(kwargs.get("context"))  # the state brings it
            self.assertIsNone(kwargs.get("context_file"))
            self.assertEqual((kwargs["binary"], kwargs["backend"], kwargs["server"]),
                             (BINARY, BACKEND, False))
        for branch in branches:
            self.assertNotEqual(branch.pid, parent.pid)
            self.assertIn("--no-echo", branch.args)
            self.assertEqual(self.run_ok(branch, "print(double(x), llm_query('q'), context)\nx"
                                         ).stdout, "42 now:q ctx\n")
        started = time.monotonic()
        self.assertEqual(branches[0].execute("while True:\n    pass").status, "timeout")
        self.assertLess(time.monotonic() - started, 30)
        self.assertEqual(self.run_ok(branches[1], "print(x)").stdout, "21\n")


class LlmQueryTest(SandboxTestCase):
    def test_callback_round_trip(self) -> None:
        calls: List[tuple] = []

        def answer(prompt: str, model: Optional[str]) -> str:
            calls.append((prompt, model))
            return f"answer to {prompt} from {model}"

        sb = self.sandbox(on_llm_query=answer)
        result = self.run_ok(sb, "print(llm_query('what?', model='small'))\n"
                                 "print(llm_query('again'))")
        self.assertEqual(result.stdout, "answer to what? from small\nanswer to again from None\n")
        self.assertEqual(calls, [("what?", "small"), ("again", None)])
        self.assertEqual(result.llm_calls, 2)

    def test_a_long_prompt_crosses_through_the_bulk_directory(self) -> None:
        # Over 64 KiB the CLI writes the prompt into the client's private --bulk-dir instead
        # of a JSON line; the client reads and removes the file, and the directory at close.
        seen: List[str] = []
        sb = self.sandbox(on_llm_query=lambda prompt, model: (seen.append(prompt), "ok")[1])
        bulk_dir = sb.args[sb.args.index("--bulk-dir") + 1]
        self.assertTrue(os.path.isdir(bulk_dir))
        self.assertEqual(oct(os.stat(bulk_dir).st_mode & 0o777), oct(0o700))
        result = self.run_ok(sb, "print(llm_query('é' * 3_000_000 + 'end'), llm_query('s'))")
        self.assertEqual(result.stdout, "ok ok\n")
        self.assertEqual(seen, ["é" * 3_000_000 + "end", "s"])
        self.assertEqual(os.listdir(bulk_dir), [])
        sb.close()
        self.assertFalse(os.path.exists(bulk_dir))

    def test_per_call_callback_wins(self) -> None:
        sb = self.sandbox(on_llm_query=lambda prompt, model: "default")
        result = self.run_ok(sb, "print(llm_query('q'))",
                             on_llm_query=lambda prompt, model: "per call")
        self.assertEqual(result.stdout, "per call\n")
        self.assertEqual(self.run_ok(sb, "print(llm_query('q'))").stdout, "default\n")

    def test_callback_that_raises_is_an_error_text_in_the_cell(self) -> None:
        # As the RLM library's llm_query: a failed call returns "Error: ..." (no exception).
        def fail(prompt: str, model: Optional[str]) -> str:
            raise ValueError(f"no model for {prompt}")

        sb = self.sandbox(on_llm_query=fail)
        result = self.run_ok(sb, "print(llm_query('q1'))")
        self.assertEqual(result.stdout, "Error: no model for q1\n")

    def test_no_callback_is_an_error_text_in_the_cell(self) -> None:
        sb = self.sandbox()
        result = self.run_ok(sb, "print(llm_query('q'))")
        self.assertTrue(result.stdout.startswith("Error: no on_llm_query callback"), result)

    def test_batched_queries_overlap_and_fail_per_item(self) -> None:
        def answer(prompt: str) -> str:
            if prompt == "p7":
                raise RuntimeError("p7 failed")
            return prompt.upper()

        slow = ConcurrencyMeter(0.2, answer)
        sb = self.sandbox(on_llm_query=slow)
        started = time.monotonic()
        result = self.run_ok(sb, (
            "import json\n"
            "print(json.dumps(llm_query_batched([f'p{i}' for i in range(20)])))"))
        elapsed = time.monotonic() - started
        items = json.loads(result.stdout)
        self.assertEqual(len(items), 20)
        self.assertEqual(items[7], "Error: p7 failed")
        self.assertEqual([x for i, x in enumerate(items) if i != 7],
                         [f"P{i}" for i in range(20) if i != 7])
        self.assertEqual(result.llm_calls, 20)
        # 20 x 0.2 s one after another would be 4 s; 8 at a time is about 0.6 s.
        self.assertLess(elapsed, 2.0)
        self.assertGreaterEqual(slow.most, 4)

    def test_slow_calls_after_fast_ones_still_overlap(self) -> None:
        # Calls that return at once are answered on the reader thread; the first slow one
        # sends the next ones back to the pool, so a batch of slow calls still overlaps.
        slow = ConcurrencyMeter(0.2, lambda prompt: "s")

        def answer(prompt: str, model: Optional[str]) -> str:
            return "f" if prompt == "fast" else slow(prompt, model)

        sb = self.sandbox(on_llm_query=answer)
        key = ("llm", None, id(answer))
        for _ in range(5):  # a busy machine may preempt a fast call and restart the count
            self.run_ok(sb, "assert llm_query_batched(['fast'] * 40) == ['f'] * 40")
            if sb._conn.dispatcher.fast(key):
                break
        self.assertTrue(sb._conn.dispatcher.fast(key))  # answering on the reader thread now
        self.assertFalse(sb._conn.dispatcher.fast(("rlm", None, id(answer))))  # its own count
        self.run_ok(sb, "assert llm_query_batched(['slow'] * 12) == ['s'] * 12")
        self.assertGreaterEqual(slow.most, 4)
        self.assertFalse(sb._conn.dispatcher.fast(key))

    def test_queries_left_by_a_crashed_cell_do_not_reach_the_next_cell(self) -> None:
        # 20 queries, 8 answered at once by the CLI: when the cell dies the other 12 are still
        # queued there, and come out as llm_query events after the cell's result.
        first: List[str] = []

        def slow(prompt: str, model: Optional[str]) -> str:
            first.append(prompt)
            time.sleep(0.3)
            return "late"

        sb = self.sandbox(on_llm_query=slow, llm_concurrency=8)
        result = sb.execute(
            "import os, threading, time\n"
            "for i in range(20):\n"
            "    threading.Thread(target=llm_query, args=(f'q{i}',), daemon=True).start()\n"
            "time.sleep(0.2)\nos._exit(3)")
        self.assertEqual(result.status, "crashed")
        self.assertTrue(result.rolled_back)
        time.sleep(1.5)  # the first answers arrive; the queued queries are sent to us
        later: List[str] = []
        result = self.run_ok(sb, "print(llm_query('fresh'))",
                             on_llm_query=lambda prompt, model: later.append(prompt) or "new")
        self.assertEqual(result.stdout, "new\n")
        self.assertEqual(later, ["fresh"])
        self.assertLessEqual(len(first), 8)

    def test_single_worker_answers_every_query(self) -> None:
        seen: List[str] = []
        sb = self.sandbox(max_llm_workers=1,
                          on_llm_query=lambda prompt, model: seen.append(prompt) or prompt * 2)
        result = self.run_ok(sb, "print(llm_query_batched(['a', 'b', 'c']))")
        self.assertEqual(result.stdout, "['aa', 'bb', 'cc']\n")
        self.assertEqual(sorted(seen), ["a", "b", "c"])

    def test_cli_side_lm(self) -> None:
        sb = self.sandbox(lm="echo", on_llm_query=lambda prompt, model: "not used")
        self.assertEqual(self.run_ok(sb, "print(llm_query('hi'))").stdout, "echo: hi\n")


class ContextTest(SandboxTestCase):
    def test_text_context(self) -> None:
        sb = self.sandbox(context="héllo\nworld")
        self.assertEqual(self.run_ok(sb, "print(type(context).__name__, len(context))").stdout,
                         "str 11\n")

    def test_json_context(self) -> None:
        value = {"docs": ["a", "b"], "n": 3, "nested": {"ok": True}}
        sb = self.sandbox(context=value)
        result = self.run_ok(sb, "FINAL(context)")
        self.assertEqual(result.final, value)
        self.assertEqual(self.run_ok(sb, "print(type(context).__name__)").stdout, "dict\n")

    def test_file_context(self) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
            handle.write("line 1\nline 2\n")
        self.addCleanup(os.unlink, handle.name)
        sb = self.sandbox(context_file=handle.name)
        self.assertEqual(self.run_ok(sb, "print(context.splitlines())").stdout,
                         "['line 1', 'line 2']\n")

    def test_json_file_context(self) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump([1, 2, 3], handle)
        self.addCleanup(os.unlink, handle.name)
        sb = self.sandbox(context_file=handle.name, context_json=True)
        self.assertEqual(self.run_ok(sb, "print(sum(context))").stdout, "6\n")

    def test_no_context_leaves_context_unbound(self) -> None:
        # As in LocalREPL: a NameError, not None.
        sb = self.sandbox()
        cell = sb.execute("print(context)")
        self.assertEqual(cell.status, "error")
        self.assertIn("NameError: name 'context' is not defined", cell.error)

    def test_deep_json_context(self) -> None:
        # Deeper than a repl line may nest: it goes through a file.
        value: Any = 0
        for _ in range(200):
            value = [value]
        sb = self.sandbox(context=value)
        code = "d, v = 0, context\nwhile isinstance(v, list):\n    d, v = d + 1, v[0]\nprint(d, v)"
        self.assertEqual(self.run_ok(sb, code).stdout, "200 0\n")

    def test_a_request_over_the_line_bound_is_refused_before_sending(self) -> None:
        sb = self.sandbox()
        with self.assertRaises(ValueError):
            sb.execute("x = '" + "a" * MAX_LINE_BYTES + "'")
        self.assertEqual(self.run_ok(sb, "print('after')").stdout, "after\n")

    def test_context_and_context_file_conflict(self) -> None:
        with self.assertRaises(ValueError):
            RlmSandbox(context="a", context_file="b", binary=BINARY)


class DocstringExampleTest(unittest.TestCase):
    def test_rlm_loop_example_runs(self) -> None:
        # The module docstring's rlm_loop, driven by a scripted "model": it must keep working.
        doc = rlm_sandbox.__doc__
        start = doc.index("    import re\n")
        source = textwrap.dedent(doc[start:doc.index("\n\nStart-up:", start)])
        namespace: Dict[str, Any] = {}
        exec(compile(source, "<rlm_loop example>", "exec"), namespace)

        def ask_model(messages: List[Dict[str, str]]) -> str:
            if messages[-1]["content"].startswith("summarize:"):
                return "SUMMARY"  # a sub-query from llm_query() in the sandbox
            turn = sum(message["role"] == "assistant" for message in messages)
            if turn == 0:
                return "Let me look.\n```python\nn = len(context)\nprint(n)\n```"
            self.assertIn("[ok]\n11\n", messages[-1]["content"])
            return ("```python\n"
                    "answer['content'] = llm_query('summarize: ' + context[:5]) + f' {n}'\n"
                    "answer['ready'] = True\n```")

        self.assertEqual(namespace["rlm_loop"]("what?", "hello world", ask_model),
                         "SUMMARY 11")


class LifecycleTest(SandboxTestCase):
    def test_bad_policy_raises_with_the_cli_message(self) -> None:
        made: List[str] = []
        real_mkdtemp = tempfile.mkdtemp

        def recorded_mkdtemp(*args: Any, **kwargs: Any) -> str:
            made.append(real_mkdtemp(*args, **kwargs))
            return made[-1]

        with mock.patch("rlm_sandbox._process.tempfile.mkdtemp", recorded_mkdtemp), \
                self.assertRaises(RlmSandboxError) as raised:
            RlmSandbox(policy="no-such-policy", backend=BACKEND, binary=BINARY)
        self.assertIn("unknown policy 'no-such-policy'", str(raised.exception))
        self.assertEqual(raised.exception.exit_code, 125)
        gc.collect()
        self.assertEqual(len(made), 1)
        self.assertFalse(os.path.exists(made[0]), "the bulk directory went with the process")

    def test_missing_binary_raises(self) -> None:
        with self.assertRaises(RlmSandboxError):
            RlmSandbox(binary="/nonexistent/rlm-sandbox")

    def test_close_returns_the_result_and_leaves_no_process(self) -> None:
        sb = self.sandbox()
        self.run_ok(sb, "x = 1")
        pid = sb.pid
        self.assertIn(pid, _descendants(os.getpid()))
        result = sb.close()
        self.assertEqual(result["status"], "ok")
        self.assertEqual(result["backend"], "namespace")
        self.assertEqual(result["policy"], "python-repl")
        self.assertIn("wall_ms", result)
        self.assertFalse(sb.running)
        self.assertEqual(sb.returncode, 0)
        self.assertNotIn(pid, _descendants(os.getpid()))
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)
        self.assertIs(sb.close(), result)  # idempotent
        with self.assertRaises(RlmSandboxError):
            sb.execute("x")

    def test_context_manager_closes(self) -> None:
        with RlmSandbox(backend=BACKEND, binary=BINARY) as sb:
            self.assertEqual(sb.execute("print(1)").stdout, "1\n")
        self.assertFalse(sb.running)
        self.assertEqual(sb.returncode, 0)

    def test_context_manager_on_exception(self) -> None:
        with self.assertRaises(KeyError):
            with RlmSandbox(backend=BACKEND, binary=BINARY) as sb:
                raise KeyError("boom")
        self.assertFalse(sb.running)

    def test_forgotten_sandbox_is_cleaned_up(self) -> None:
        sb = RlmSandbox(backend=BACKEND, binary=BINARY)
        proc = sb._conn.proc
        self.assertIsNone(proc.poll())
        del sb
        gc.collect()
        self.assertIsNotNone(proc.poll())

    def test_process_dying_raises_with_stderr(self) -> None:
        sb = self.sandbox()
        sb._conn.proc.kill()
        with self.assertRaises(RlmSandboxError) as raised:
            sb.execute("1")
        self.assertIn("exited", str(raised.exception))
        self.assertEqual(sb.close(), {})


_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")

_NEVER_CLOSED = """
sb = RlmSandbox(backend=BACKEND, binary=BINARY)
print(sb.pid, flush=True)
assert sb.execute("print(1)").stdout == "1\\n"
"""

# The last reference goes when the interpreter clears the module's globals, and the owner's
# __del__ closes the sandbox then (as an RLM environment's cleanup in __del__ does).
_CLOSED_FROM_DEL = """
class Owner:
    def __init__(self):
        self.sb = RlmSandbox(backend=BACKEND, binary=BINARY)
    def __del__(self):
        self.sb.close()
        print("closed", flush=True)
owner = Owner()
print(owner.sb.pid, flush=True)
assert owner.sb.execute("print(2)").stdout == "2\\n"
"""


class InterpreterExitTest(unittest.TestCase):
    """A sandbox left open when Python exits: the interpreter exits cleanly and the CLI with it,
    with the client's exit hook (the usual case) and without it (what is left for __del__ and
    close() while the interpreter is finalizing, when no other thread runs any more)."""

    def run_script(self, body: str, exit_hook: bool) -> subprocess.CompletedProcess:
        head = ("import sys\n"
                f"sys.path.insert(0, {_PACKAGE_DIR!r})\n"
                "from rlm_sandbox import RlmSandbox\n"
                f"BACKEND, BINARY = {BACKEND!r}, {BINARY!r}\n")
        if not exit_hook:
            head += ("import atexit, rlm_sandbox.session\n"
                     "atexit.unregister(rlm_sandbox.session._close_open_sandboxes)\n")
        try:
            done = subprocess.run([sys.executable, "-c", head + body], capture_output=True,
                                  text=True, timeout=60)
        except subprocess.TimeoutExpired as error:
            self.fail(f"the interpreter did not exit within 60 s: {error.stderr}")
        self.assertNotIn("Fatal Python error", done.stderr)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assert_gone(int(done.stdout.split()[0]))
        return done

    def assert_gone(self, pid: int) -> None:
        """The repl process (reparented once its parent exited) ends within a few seconds."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as stat:
                    if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.05)
        self.fail(f"rlm-sandbox repl {pid} still runs after its client exited")

    def test_never_closed_sandbox_exits_cleanly(self) -> None:
        self.run_script(_NEVER_CLOSED, exit_hook=True)

    def test_never_closed_sandbox_exits_cleanly_without_the_exit_hook(self) -> None:
        self.run_script(_NEVER_CLOSED, exit_hook=False)

    def test_close_from_del_at_shutdown_returns(self) -> None:
        done = self.run_script(_CLOSED_FROM_DEL, exit_hook=True)
        self.assertIn("closed", done.stdout)

    def test_a_forked_child_exiting_leaves_the_session_open(self) -> None:
        # The child's exit hook and collection must not close its parent's session.
        done = self.run_script(_NEVER_CLOSED + """
import os
child = os.fork()
if child == 0:
    sys.exit(0)  # a normal exit: exit hooks and finalization run in the child
os.waitpid(child, 0)
assert sb.execute("print(3)").stdout == "3\\n", "the child closed the session"
""", exit_hook=True)
        self.assertEqual(done.stderr, "")

    def test_close_from_del_while_finalizing_returns(self) -> None:
        done = self.run_script(_CLOSED_FROM_DEL, exit_hook=False)
        self.assertIn("closed", done.stdout)


if __name__ == "__main__":
    unittest.main()
