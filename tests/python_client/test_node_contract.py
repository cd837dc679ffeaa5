"""The node contract of ``rlm-sandbox serve`` (issue 28, docs/fleet.md) through the Python client:
``Server.health()``, ``ready()``, ``capacity()`` and ``drain()``, the cap of ``--max-sandboxes``
(``resource_exhausted`` at once), draining (``draining`` refusals, running work goes on, the
server exits 0; past the grace, ``node_drained``), and the node named in results and sessions.

Every test starts servers of its own (``--node-id``, ``--max-sandboxes``, ``--drain-grace``),
since a drain ends its server; each is stopped and its directory removed, on failure too.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_node_contract`` from
tests/python_client (ctest's ``python_node_contract`` test does this).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from rlm_sandbox import RlmSandboxError, RunResult, ServerSession  # noqa: E402
from serve_process import BINARY, RefusedAtOnce, ServeProcess  # noqa: E402

#: Deadlines, generous: the tests share a loaded 2-CPU machine with other suites.
STARTUP_SECONDS = 60.0
SETTLE_SECONDS = 60.0
#: "At once": a refusal that is not queued behind the held sandboxes comes well within this
#: (a session's cold start alone takes longer on a loaded machine).
AT_ONCE_SECONDS = 5.0

#: No warm sandboxes or sessions: nothing to build in the background, and ready from the start.
COLD_POOLS = ("--pool", "default=0", "--session-pool", "python-repl=0")

# An interpreter uid 65534 may run (this one may live in root's home).
_NOBODY_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def setUpModule() -> None:  # noqa: N802 - unittest's name
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")


def _meminfo_bytes(key: str) -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0]) * 1024
    raise AssertionError(f"/proc/meminfo has no {key}")


class Node(ServeProcess):
    """One ``rlm-sandbox serve`` of a test's own, in a directory of its own (see ServeProcess)."""

    def __init__(self, node_id: Optional[str], *flags: str,
                 pools: Sequence[str] = COLD_POOLS) -> None:
        super().__init__((*pools, *flags), node_id=node_id, prefix="rlm-node-contract-",
                         socket_name="node.sock")


class NodeTestCase(RefusedAtOnce):
    """Starts nodes that are stopped (and sessions that are closed) whatever the test does."""

    at_once_seconds = AT_ONCE_SECONDS

    def node(self, node_id: Optional[str] = "node-a", *flags: str,
             pools: Sequence[str] = COLD_POOLS) -> Node:
        node = Node(node_id, *flags, pools=pools)
        self.addCleanup(node.stop)
        node.wait_for_socket(STARTUP_SECONDS)
        return node

    def session(self, node: Node) -> ServerSession:
        session = node.server.session("python-repl")
        self.addCleanup(ServerSession._discard, session)
        return session

    def until(self, what: str, check: Callable[[], Any],
              seconds: float = SETTLE_SECONDS) -> Any:
        """`check()`'s first true value, polled; fails the test after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() >= deadline:
                self.fail(f"{what}: not within {seconds} s (last: {value!r})")
            time.sleep(0.05)

    def in_thread(self, work: Callable[[], Any]) -> Callable[[float], Any]:
        """Starts `work()` on a thread; returns `result(seconds)`: its value (or its exception,
        raised), failing the test if it has not ended within `seconds`."""
        box: Dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = work()
            except BaseException as error:  # noqa: BLE001 - handed to the test's thread
                box["error"] = error

        thread = threading.Thread(target=target, daemon=True)
        thread.start()

        def result(seconds: float) -> Any:
            thread.join(seconds)
            if thread.is_alive():
                self.fail(f"the request did not end within {seconds} s")
            if "error" in box:
                raise box["error"]
            return box["value"]

        return result


class ContractAnswersTest(NodeTestCase):
    """health, ready and capacity: what a fleet's client polls."""

    def test_health_names_the_node_and_its_pid(self) -> None:
        node = self.node("node-a")
        self.assertEqual(node.server.health(),
                         {"op": "health", "alive": True, "node": "node-a", "pid": node.proc.pid})

    def test_the_node_id_defaults_to_the_host_name(self) -> None:
        node = self.node(None)
        self.assertEqual(node.server.health()["node"], socket.gethostname())
        self.assertEqual(node.server.capacity()["node_id"], socket.gethostname())

    def test_a_node_id_that_cannot_name_a_session_is_refused(self) -> None:
        directory = tempfile.mkdtemp(prefix="rlm-node-contract-")
        self.addCleanup(shutil.rmtree, directory, True)
        for bad in ("a/b", "", "x" * 65, "node a"):
            with self.subTest(node_id=bad):
                serve = subprocess.run(
                    [BINARY, "serve", "--socket", os.path.join(directory, "never-bound.sock"),
                     *COLD_POOLS, "--node-id", bad],
                    stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
                self.assertNotEqual(serve.returncode, 0)
                self.assertIn("--node-id", serve.stderr.decode(errors="replace"))

    def test_capacity_describes_the_node(self) -> None:
        node = self.node("node-cap", "--max-sandboxes", "3")
        capacity = node.server.capacity()
        self.assertEqual(capacity["op"], "capacity")
        self.assertEqual(capacity["node_id"], "node-cap")
        self.assertIsInstance(capacity["version"], str)
        self.assertTrue(capacity["version"])
        features = capacity["features"]
        self.assertIn("namespace", features["backends"])
        self.assertTrue(set(features["backends"]) <= {"namespace", "landlock", "docker", "local"},
                        features)
        self.assertIn(features["cgroup"], ("v1", "v2", "none"))
        self.assertIsInstance(features["landlock_abi"], int)
        self.assertGreaterEqual(features["landlock_abi"], 0)
        self.assertIs(features["sessions"], True)
        self.assertEqual(capacity["cores"], len(os.sched_getaffinity(0)))
        self.assertEqual(capacity["memory_bytes"], _meminfo_bytes("MemTotal"))
        self.assertGreater(capacity["memory_available_bytes"], 0)
        self.assertLessEqual(capacity["memory_available_bytes"], capacity["memory_bytes"])
        self.assertEqual(capacity["max_sandboxes"], 3)
        self.assertEqual((capacity["running"], capacity["starting"]), (0, 0))
        self.assertEqual(capacity["warm_idle"], {
            "default": {"sandboxes": 0, "sessions": 0, "min_sandboxes": 0, "min_sessions": 0},
            "python-repl": {"sandboxes": 0, "sessions": 0, "min_sandboxes": 0,
                            "min_sessions": 0}})
        self.assertEqual(set(capacity["pressure"]), {"cpu", "memory", "io"})
        for resource, value in capacity["pressure"].items():
            self.assertTrue(value is None or isinstance(value, float), (resource, value))
            if value is not None:
                self.assertTrue(0.0 <= value <= 100.0, (resource, value))
        self.assertIs(capacity["draining"], False)
        self.assertIs(capacity["ready"], True)

    def test_no_cap_is_max_sandboxes_zero(self) -> None:
        node = self.node("node-nocap")
        self.assertEqual(node.server.capacity()["max_sandboxes"], 0)

    def test_ready_once_the_warm_pool_holds_its_minimum(self) -> None:
        node = self.node("node-warm", pools=("--pool", "default=0",
                                             "--session-pool", "python-repl=1"))
        not_ready: List[Dict[str, Any]] = []

        def ready() -> bool:
            answer = node.server.ready()
            self.assertEqual((answer["op"], answer["node"]), ("ready", "node-warm"))
            if not answer["ready"]:
                not_ready.append(answer)
            return answer["ready"]

        self.until("the node ready", ready)
        # Until the warm session is up, the node is not ready and says which pool lacks it.
        for answer in not_ready:
            self.assertTrue(answer["why"], answer)
            self.assertTrue(all("python-repl" in why for why in answer["why"]), answer)
        self.assertEqual(node.server.ready(),
                         {"op": "ready", "node": "node-warm", "ready": True, "why": []})
        capacity = node.server.capacity()
        self.assertIs(capacity["ready"], True)
        self.assertEqual(capacity["warm_idle"]["python-repl"],
                         {"sandboxes": 0, "sessions": 1, "min_sandboxes": 0, "min_sessions": 1})
        self.assertEqual(capacity["warm_idle"]["default"],
                         {"sandboxes": 0, "sessions": 0, "min_sandboxes": 0, "min_sessions": 0})

        # The warm session taken: counted as running, and the pool refills to its minimum.
        sb = self.session(node)
        capacity = node.server.capacity()
        self.assertEqual((capacity["running"], capacity["starting"]), (1, 0))
        self.until("the pool refilled",
                   lambda: node.server.capacity()["warm_idle"]["python-repl"]["sessions"] == 1)
        self.until("ready again", lambda: node.server.ready()["ready"])
        self.assertEqual(sb.execute("print(6 * 7)").stdout, "42\n")


class NodeNamingTest(NodeTestCase):
    """Every result and session names the node that served it."""

    def test_a_run_result_names_its_node(self) -> None:
        node = self.node("node-run")
        result = node.server.run(["sh", "-c", "echo hi"])
        self.assertIsInstance(result, RunResult)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, "hi\n")
        self.assertEqual(result.node, "node-run")
        self.assertEqual(result.raw["node"], "node-run")

    def test_a_session_and_its_id_name_the_node(self) -> None:
        node = self.node("node-ses")
        first, second = self.session(node), self.session(node)
        for sb in (first, second):
            self.assertEqual(sb.node, "node-ses")
            self.assertRegex(sb.session_id, r"^node-ses/\d+$")
            self.assertIn(sb.session_id, repr(sb))
        self.assertNotEqual(first.session_id, second.session_id)
        self.assertEqual(first.execute("print('still a session')").stdout, "still a session\n")

    def test_result_json_without_a_node(self) -> None:
        self.assertEqual(RunResult.from_json({"status": "ok"}).node, "")
        self.assertEqual(RunResult.from_json({"status": "node_drained", "node": "n"}).node, "n")


class MaxSandboxesTest(NodeTestCase):
    """--max-sandboxes N: past N runs and sessions held, resource_exhausted at once."""

    def test_open_sessions_hold_the_cap_and_free_it_when_closed(self) -> None:
        node = self.node("node-max", "--max-sandboxes", "2")
        first, second = self.session(node), self.session(node)
        capacity = node.server.capacity()
        self.assertEqual((capacity["running"], capacity["starting"]), (2, 0))
        self.assertEqual(capacity["max_sandboxes"], 2)

        error = self.refused("resource_exhausted", lambda: node.server.session("python-repl"))
        self.assertIn("node-max", str(error))
        self.assertIn("--max-sandboxes", str(error))
        self.refused("resource_exhausted", lambda: node.server.run(["true"]))
        # The sessions held go on; the refusals took nothing.
        self.assertEqual(first.execute("print('first')").stdout, "first\n")
        self.assertEqual(node.server.capacity()["running"], 2)

        second.close()
        self.until("the closed session's slot freed",
                   lambda: node.server.capacity()["running"] == 1)
        third = self.session(node)
        self.assertEqual(third.execute("print('third')").stdout, "third\n")
        self.assertEqual(node.server.capacity()["running"], 2)
        self.refused("resource_exhausted", lambda: node.server.run(["true"]))
        third.close()
        self.until("the slot freed again", lambda: node.server.capacity()["running"] == 1)
        result = node.server.run(["sh", "-c", "echo ran"])
        self.assertEqual((result.status, result.stdout, result.node), ("ok", "ran\n", "node-max"))

    def test_a_slot_is_free_once_close_or_the_result_is_back(self) -> None:
        # A client that closes a session (or has a run's result) and asks again at once must not
        # be refused: it would place the request on another node for nothing.
        node = self.node("node-reuse", "--max-sandboxes", "1")
        for attempt in range(5):
            with self.subTest(attempt=attempt):
                sb = node.server.session("python-repl")
                sb.close()
                result = node.server.run(["true"])
                self.assertEqual(result.status, "ok", result)
                self.assertEqual(node.server.run(["true"]).status, "ok")

    def test_a_running_run_holds_a_slot(self) -> None:
        node = self.node("node-max1", "--max-sandboxes", "1")
        running = self.in_thread(lambda: node.server.run(["sh", "-c", "sleep 3; echo slept"]))
        self.until("the run counted", lambda: node.server.capacity()["running"] == 1)
        self.refused("resource_exhausted", lambda: node.server.session("python-repl"))
        result = running(SETTLE_SECONDS)
        self.assertEqual((result.status, result.stdout), ("ok", "slept\n"), result)
        self.until("the run's slot freed", lambda: node.server.capacity()["running"] == 0)
        self.assertEqual(node.server.run(["true"]).status, "ok")


class DrainTest(NodeTestCase):
    """drain (the op, or SIGTERM): ready false, new work refused "draining", running work goes
    on for the grace, the server exits 0 once nothing runs; past the grace, node_drained."""

    def assert_draining(self, node: Node, node_id: str) -> None:
        ready = node.server.ready()
        self.assertIs(ready["ready"], False)
        self.assertTrue(any("draining" in why for why in ready["why"]), ready)
        capacity = node.server.capacity()
        self.assertIs(capacity["draining"], True)
        self.assertIs(capacity["ready"], False)
        self.assertTrue(node.server.health()["alive"])
        error = self.refused("draining", lambda: node.server.run(["true"]))
        self.assertIn(node_id, str(error))
        self.refused("draining", lambda: node.server.session("python-repl"))

    def test_an_idle_node_exits_at_once(self) -> None:
        node = self.node("node-idle")
        self.assertEqual(node.server.drain(grace=0.5),
                         {"op": "draining", "node": "node-idle", "grace_ms": 500})
        self.assertEqual(node.exit_code(), 0, node.log())
        self.assertFalse(os.path.exists(node.socket))

    def test_grace_arguments(self) -> None:
        node = self.node("node-args", "--drain-grace", "7s")
        for bad in (-1, "soon", True):
            with self.subTest(grace=bad), self.assertRaises(ValueError):
                node.server.drain(grace=bad)
        self.assertTrue(node.server.health()["alive"])  # nothing was sent
        # No grace given: the server's --drain-grace.
        self.assertEqual(node.server.drain()["grace_ms"], 7000)
        self.assertEqual(node.exit_code(), 0, node.log())

    def test_an_open_session_goes_on_and_the_node_exits_once_it_closes(self) -> None:
        node = self.node("node-drain", "--drain-grace", "10m")
        sb = self.session(node)
        self.assertEqual(sb.execute("x = 20").status, "ok")
        self.assertEqual(node.server.drain(),
                         {"op": "draining", "node": "node-drain", "grace_ms": 600000})
        self.assert_draining(node, "node-drain")
        # The session holds the node up and keeps its state.
        self.assertEqual(sb.execute("print(x + 22)").stdout, "42\n")
        time.sleep(1.0)
        self.assertIsNone(node.proc.poll(), "the node exited with a session open")
        # A second drain does not lengthen the first's grace, and the node is still draining.
        self.assertEqual(node.server.drain(grace=3600)["op"], "draining")
        self.assert_draining(node, "node-drain")
        self.assertEqual(sb.execute("print(x)").stdout, "20\n")
        closed = sb.close()
        self.assertEqual(closed.get("status"), "ok", closed)
        self.assertEqual(closed.get("node"), "node-drain", closed)  # every Result names its node
        self.assertEqual(node.exit_code(), 0, node.log())
        self.assertFalse(os.path.exists(node.socket))

    def test_sigterm_drains_and_a_running_run_finishes(self) -> None:
        node = self.node("node-term", "--drain-grace", "10m")
        running = self.in_thread(
            lambda: node.server.run(["sh", "-c", "sleep 4; echo finished"]))
        self.until("the run counted", lambda: node.server.capacity()["running"] == 1)
        node.proc.send_signal(signal.SIGTERM)
        self.until("draining after SIGTERM", lambda: node.server.capacity()["draining"])
        self.assert_draining(node, "node-term")
        result = running(SETTLE_SECONDS)
        self.assertEqual((result.status, result.stdout, result.node),
                         ("ok", "finished\n", "node-term"), result)
        self.assertEqual(node.exit_code(), 0, node.log())

    def test_a_second_sigterm_stops_at_once(self) -> None:
        node = self.node("node-term2", "--drain-grace", "10m")
        sb = self.session(node)
        node.proc.send_signal(signal.SIGTERM)
        self.until("draining after SIGTERM", lambda: node.server.capacity()["draining"])
        node.proc.send_signal(signal.SIGTERM)
        self.assertEqual(node.exit_code(), 0, node.log())
        with self.assertRaises(RlmSandboxError):
            sb.execute("print(1)")

    def test_work_outliving_the_grace_ends_node_drained(self) -> None:
        node = self.node("node-grace", "--drain-grace", "2s")
        sb = self.session(node)
        self.assertEqual(sb.execute("x = 1").status, "ok")
        running = self.in_thread(lambda: node.server.run(["sh", "-c", "sleep 300"]))
        self.until("the run counted", lambda: node.server.capacity()["running"] == 2)
        began = time.monotonic()
        self.assertEqual(node.server.drain()["grace_ms"], 2000)
        self.assert_draining(node, "node-grace")

        result = running(SETTLE_SECONDS)
        self.assertEqual(result.status, "node_drained", result)
        self.assertIn("node_drained", result.detail)
        self.assertEqual(result.node, "node-grace")
        self.assertGreaterEqual(time.monotonic() - began, 1.5)

        # The session was ended with it: its next cell fails, saying why.
        try:
            cell = sb.execute("print(x)")
            failure = f"{cell.status}: {cell.error}"
            self.assertNotEqual(cell.status, "ok", cell)
        except RlmSandboxError as error:
            failure = str(error)
        self.assertIn("node_drained", failure)
        # It ended as the run did: its Result says node_drained too.
        closed = sb.close()
        self.assertEqual(closed.get("status"), "node_drained", closed)
        self.assertEqual(node.exit_code(), 0, node.log())

    def test_an_idle_session_past_the_grace_lets_the_node_exit(self) -> None:
        node = self.node("node-idle-ses", "--drain-grace", "1s")
        sb = self.session(node)
        node.server.drain()
        # Nobody uses or closes the session: the node still exits, and says so to the session.
        self.assertEqual(node.exit_code(), 0, node.log())
        with self.assertRaises(RlmSandboxError):
            sb.execute("print(1)")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to start a process as uid 65534")
    def test_only_the_operator_may_drain(self) -> None:
        node = self.node("node-op", "--allow-uid", "65534", "--socket-mode", "0666")
        package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        client = subprocess.run(
            [_NOBODY_PYTHON, "-c",
             "import sys; sys.path.insert(0, sys.argv[1])\n"
             "from rlm_sandbox import Server, ServerError\n"
             "server = Server(sys.argv[2])\n"
             "print(server.health()['node'], server.ready()['ready'], "
             "server.capacity()['node_id'])\n"
             "try:\n"
             "    server.drain()\n"
             "except ServerError as error:\n"
             "    print(error.kind, error)\n",
             package, node.socket],
            user=65534, group=65534, extra_groups=[], capture_output=True, timeout=120,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        lines = client.stdout.decode().splitlines()
        self.assertEqual(len(lines), 2, (client.stdout, client.stderr))
        self.assertEqual(lines[0], "node-op True node-op")
        self.assertTrue(lines[1].startswith("refused "), lines[1])
        self.assertIn("drain", lines[1])
        self.assertIs(node.server.capacity()["draining"], False)
        self.assertTrue(node.server.ready()["ready"])
        self.assertEqual(node.server.run(["true"]).status, "ok")


if __name__ == "__main__":
    unittest.main()
