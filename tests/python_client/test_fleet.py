"""Placement across a fleet (issue 28, docs/fleet.md) through the Python client: ``read_fleet``
of files and directories and its refusals; ``Fleet`` over three real ``rlm-sandbox serve``
nodes that register themselves in a directory (``--register``): 24 sessions spread 8/8/8 and a
25th refused ``resource_exhausted`` at once; a node killed with SIGKILL loses its sessions
(``node_lost`` within 2 s) and new sessions land on the others; a drained node takes nothing new
while its session finishes; ``status()`` lists a dead node with its error; 30 runs at once on 24
slots: 24 results, 6 ``resource_exhausted``, none hanging.

Every test starts nodes of its own (a kill or a drain ends one); each is stopped and its
directory removed, on failure too.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_fleet`` from
tests/python_client (ctest's ``python_fleet`` test does this).
"""

from __future__ import annotations

import collections
import os
import shutil
import json
import math
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Dict, List, Optional, Sequence
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from rlm_sandbox import (Fleet, RlmSandboxError, Server, ServerError,  # noqa: E402
                         ServerSession, read_fleet)
from rlm_sandbox._wire import Wire  # noqa: E402
from rlm_sandbox.fleet import _room, expand_slurm_hostlist  # noqa: E402
from serve_process import BINARY, RefusedAtOnce, ServeProcess  # noqa: E402

#: Deadlines, generous: the tests share a loaded 2-CPU machine with other suites.
STARTUP_SECONDS = 90.0
SETTLE_SECONDS = 60.0
#: "At once": a refusal that is not queued behind the held sandboxes comes well within this.
AT_ONCE_SECONDS = 5.0
#: A session of a node killed with SIGKILL says node_lost within this (issue 28's acceptance).
LOST_SECONDS = 2.0
#: A placement among fake nodes that answer badly ends within this (each is asked once, with a
#: deadline of ask_timeout, 2 s by default).
PASSED_OVER_SECONDS = 15.0

NODE_FLAGS = ("--max-sandboxes", "8", "--session-pool", "python-repl=0", "--pool", "default=1")


def setUpModule() -> None:  # noqa: N802 - unittest's name
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")


class Node(ServeProcess):
    """One ``rlm-sandbox serve --register`` in a directory of its own (see ServeProcess)."""

    def __init__(self, node_id: str, registry: str, flags: Sequence[str]) -> None:
        super().__init__(flags, node_id=node_id, register=registry,
                         prefix=f"rlm-fleet-{node_id}-", name=f"node {node_id}")

    def registered(self) -> bool:
        """Listening, answering and in the registry; RuntimeError if the server exited."""
        self.raise_if_exited(f"rlm-sandbox serve {self.node_id}")
        if not os.path.exists(self.endpoint_file):
            return False
        try:
            return bool(self.server.ready()["ready"])
        except RlmSandboxError:
            return False


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def capacity_json(**fields: Any) -> bytes:
    """A node's capacity answer as the wire carries it; fields given as raw JSON text (so an
    answer can hold NaN or a 400-digit integer, which json.dumps would not write) replace the
    plausible ones."""
    plain = {"op": '"capacity"', "node_id": '"fake"', "max_sandboxes": "1", "running": "0",
             "starting": "0", "draining": "false",
             "features": '{"backends":["namespace","local"]}',
             "warm_idle": '{"default":{"sandboxes":0,"sessions":0}}', **fields}
    return frame(("{" + ",".join(f'"{key}":{value}' for key, value in plain.items())
                  + "}").encode())


class FakeNode:
    """A unix socket in a directory of its own, answered by a thread of this process: one frame
    per connection, `capacity` (the bytes of a whole frame) to a ``capacity`` request and
    ``resource_exhausted`` to anything else; or, with `trickle`, a header announcing 1000 bytes
    and then one byte a second until the client goes away."""

    def __init__(self, capacity: bytes = b"", trickle: bool = False) -> None:
        self.capacity = capacity
        self.trickle = trickle
        self.dir = tempfile.mkdtemp(prefix="rlm-fleet-fake-")
        self.socket = os.path.join(self.dir, "s.sock")
        self.endpoint = "unix:" + self.socket
        self.asked = 0
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket)
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _read(self, connection: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = connection.recv(size - len(data))
            if not chunk:
                raise OSError("the client went away")
            data += chunk
        return data

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.settimeout(10.0)
                (size,) = struct.unpack(">I", self._read(connection, 4))
                request = json.loads(self._read(connection, size))
                self.asked += 1
                if request.get("op") != "capacity":
                    connection.sendall(frame(json.dumps(
                        {"op": "error", "kind": "resource_exhausted",
                         "message": "a fake node takes nothing"}).encode()))
                elif self.trickle:
                    connection.sendall(struct.pack(">I", 1000) + b"{")
                    while not self._stop.wait(1.0):
                        connection.sendall(b" ")
                else:
                    connection.sendall(self.capacity)
            except OSError:
                pass  # the client gave up on it: what a trickling node is for

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(5.0)
        shutil.rmtree(self.dir, ignore_errors=True)


def by_node(items: Sequence[Any]) -> Dict[str, int]:
    return dict(collections.Counter(item.node for item in items))


class FleetTestCase(RefusedAtOnce):
    """Three nodes n1..n3 registered in a directory of the test's own, stopped (and every
    session closed) whatever the test does."""

    at_once_seconds = AT_ONCE_SECONDS

    def start_nodes(self, *extra: str) -> List[Node]:
        self.registry = tempfile.mkdtemp(prefix="rlm-fleet-registry-")
        self.addCleanup(shutil.rmtree, self.registry, True)
        nodes: List[Node] = []
        for number in (1, 2, 3):
            node = Node(f"n{number}", self.registry, (*NODE_FLAGS, *extra))
            self.addCleanup(node.stop)
            nodes.append(node)
        deadline = time.monotonic() + STARTUP_SECONDS
        while not all(node.registered() for node in nodes):
            if time.monotonic() >= deadline:
                self.fail("the nodes did not register and become ready within "
                          f"{STARTUP_SECONDS} s: " + "\n".join(node.log() for node in nodes))
            time.sleep(0.1)
        self.nodes = nodes
        return nodes

    def open_sessions(self, fleet: Fleet, count: int, workers: int = 3) -> List[ServerSession]:
        """`count` sessions placed by `fleet`, a few at once; each closed at cleanup."""
        sessions: List[ServerSession] = []
        errors: List[BaseException] = []
        lock = threading.Lock()
        left = [count]

        def work() -> None:
            while True:
                with lock:
                    if left[0] == 0 or errors:
                        return
                    left[0] -= 1
                try:
                    session = fleet.session("python-repl")
                except BaseException as error:  # noqa: BLE001 - raised on the test's thread
                    with lock:
                        errors.append(error)
                    return
                with lock:
                    sessions.append(session)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SETTLE_SECONDS * 3)
        for session in sessions:
            self.addCleanup(ServerSession._discard, session)
        self.assertFalse(any(thread.is_alive() for thread in threads), "a session open hung")
        if errors:
            raise errors[0]
        self.assertEqual(len(sessions), count)
        return sessions


class ReadFleetTest(unittest.TestCase):
    """The sources of a fleet's endpoints, and what is refused; no server needed."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlm-fleet-read-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as file:
            file.write(text)
        return path

    def refusal(self, source: str) -> str:
        with self.assertRaises(RlmSandboxError) as caught:
            read_fleet(source)
        return str(caught.exception)

    def test_a_file_of_endpoints(self) -> None:
        path = self.write("fleet.txt", "# three nodes\nunix:/run/a.sock\n\n  /run/b.sock  # b\r\n"
                                       "\t#\nunix:/run/c.sock")
        expected = ["unix:/run/a.sock", "/run/b.sock", "unix:/run/c.sock"]
        self.assertEqual(read_fleet(path), expected)
        self.assertEqual(Fleet(path).endpoints, expected)

    def test_a_file_refuses_other_endpoints_naming_the_line(self) -> None:
        for line in ("tls://10.0.0.1", "tcp://10.0.0.1:7000", "run/relative.sock",
                     "unix:relative.sock", "unix:"):
            with self.subTest(endpoint=line):
                path = self.write("bad.txt", f"unix:/run/a.sock\n# c\n{line}\n")
                message = self.refusal(path)
                self.assertIn(f"fleet {path} line 3", message)
                self.assertIn(line, message)
        message = self.refusal(self.write("long.txt", "/" + "x" * 5000 + "\n"))
        self.assertIn("line 1", message)

    def test_no_endpoints_or_no_source(self) -> None:
        message = self.refusal(self.write("empty.txt", "# nobody\n\n"))
        self.assertIn("no endpoints", message)
        self.assertNotIn("registered", message)
        self.assertIn("no such file or directory",
                      self.refusal(os.path.join(self.dir, "missing.txt")))

    def test_a_directory_of_endpoint_files(self) -> None:
        registry = os.path.join(self.dir, "registry")
        os.mkdir(registry)
        for name, text in (("n2.endpoint", "unix:/run/n2.sock\n"),
                           ("n1.endpoint", "/run/n1.sock\nignored second line\n"),
                           ("n0.endpoint", ""),                     # being written
                           ("notes.txt", "not an endpoint\n"),
                           (".n3.endpoint.new", "unix:/run/n3.sock\n"),
                           (".endpoint", "unix:/run/nameless.sock\n")):
            self.write(os.path.join("registry", name), text)
        os.mkdir(os.path.join(registry, "dir.endpoint"))
        os.symlink(os.path.join(registry, "n2.endpoint"), os.path.join(registry, "n9.endpoint"))
        self.assertEqual(read_fleet(registry), ["/run/n1.sock", "unix:/run/n2.sock"])

        # A file of another kind is skipped, not a refusal of the whole fleet; a TLS
        # listener's is an endpoint like the others.
        self.write(os.path.join("registry", "n5.endpoint"), "tcp://10.0.0.5:7000\n")
        self.assertEqual(read_fleet(registry), ["/run/n1.sock", "unix:/run/n2.sock"])
        self.write(os.path.join("registry", "n6.endpoint"), "tls://10.0.0.6:7000\n")
        self.assertEqual(read_fleet(registry),
                         ["/run/n1.sock", "unix:/run/n2.sock", "tls://10.0.0.6:7000"])

        empty = os.path.join(self.dir, "empty-registry")
        os.mkdir(empty)
        self.assertIn("registered", self.refusal(empty))

    def test_a_directory_skips_bad_endpoint_files(self) -> None:
        """Anyone who can write a registry can drop a bad file there: it is skipped (a FIFO
        without blocking), and only a registry with no good endpoint left is refused."""
        registry = os.path.join(self.dir, "registry")
        os.mkdir(registry)
        outside = self.write("outside.txt", "unix:/run/outside.sock\n")
        self.write(os.path.join("registry", "evil.endpoint"), "tcp://evil:1\n")
        self.write(os.path.join("registry", "long.endpoint"), "/" + "x" * 5000 + "\n")
        self.write(os.path.join("registry", "nul.endpoint"), "/run/a\0b.sock\n")
        self.write(os.path.join("registry", "relative.endpoint"), "run/r.sock\n")
        os.mkfifo(os.path.join(registry, "fifo.endpoint"))
        os.symlink(outside, os.path.join(registry, "link.endpoint"))
        os.symlink(os.path.join(self.dir, "missing"), os.path.join(registry, "dangling.endpoint"))
        self.write(os.path.join("registry", "good.endpoint"), "unix:/run/good.sock\n")

        box: Dict[str, Any] = {}

        def read() -> None:
            try:
                box["endpoints"] = read_fleet(registry)
            except BaseException as error:  # noqa: BLE001 - reported by the test's thread
                box["error"] = error

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(AT_ONCE_SECONDS)
        self.assertFalse(reader.is_alive(), "read_fleet blocked (on the FIFO?)")
        self.assertEqual(box, {"endpoints": ["unix:/run/good.sock"]})
        self.assertEqual(Fleet(registry).endpoints, ["unix:/run/good.sock"])

        # With the good one gone, nothing is left: refused, with the hint.
        os.unlink(os.path.join(registry, "good.endpoint"))
        message = self.refusal(registry)
        self.assertIn("no endpoints", message)
        self.assertIn("registered", message)
        # A file of endpoints stays strict: its bad line is refused, named.
        message = self.refusal(self.write("fleet.txt", "unix:/run/a.sock\ntcp://evil:1\n"))
        self.assertIn("line 2", message)
        self.assertIn("tcp://evil:1", message)

    def test_refresh_sees_nodes_that_come_and_go(self) -> None:
        registry = os.path.join(self.dir, "registry")
        os.mkdir(registry)
        self.write(os.path.join("registry", "a.endpoint"), "unix:/run/a.sock\n")
        fleet = Fleet(registry)
        self.assertEqual(fleet.endpoints, ["unix:/run/a.sock"])
        self.write(os.path.join("registry", "b.endpoint"), "unix:/run/b.sock\n")
        self.assertEqual(fleet.endpoints, ["unix:/run/a.sock"])
        self.assertEqual(fleet.refresh(), ["unix:/run/a.sock", "unix:/run/b.sock"])
        os.unlink(os.path.join(registry, "a.endpoint"))
        self.assertEqual(fleet.refresh(), ["unix:/run/b.sock"])

    def test_fleet_arguments(self) -> None:
        with self.assertRaises(ValueError):
            Fleet([])
        with self.assertRaises(ValueError) as caught:
            Fleet(["unix:/run/a.sock", "tls://10.0.0.1"])
        self.assertIn("tls://10.0.0.1", str(caught.exception))
        self.assertEqual(Fleet(["unix:/run/a.sock", "tls://10.0.0.1:7000"]).endpoints,
                         ["unix:/run/a.sock", "tls://10.0.0.1:7000"])
        for choices in (0, -1, True, 1.5):
            with self.subTest(choices=choices), self.assertRaises(ValueError):
                Fleet(["/run/a.sock"], choices=choices)
        self.assertEqual(Fleet(("/run/a.sock", "unix:/run/b.sock")).endpoints,
                         ["/run/a.sock", "unix:/run/b.sock"])

    def test_the_environment_names_the_fleet(self) -> None:
        path = self.write("fleet.txt", "unix:/run/env.sock\n")
        saved = os.environ.pop("RLM_SANDBOX_FLEET", None)
        try:
            with self.assertRaises(RlmSandboxError) as caught:
                Fleet()
            self.assertIn("RLM_SANDBOX_FLEET", str(caught.exception))
            os.environ["RLM_SANDBOX_FLEET"] = path
            self.assertEqual(Fleet().endpoints, ["unix:/run/env.sock"])
        finally:
            os.environ.pop("RLM_SANDBOX_FLEET", None)
            if saved is not None:
                os.environ["RLM_SANDBOX_FLEET"] = saved

    def test_no_node_answering_is_resource_exhausted_naming_each(self) -> None:
        endpoints = [f"unix:{self.dir}/gone{number}.sock" for number in range(4)]
        fleet = Fleet(endpoints, seed=7)
        began = time.monotonic()
        for request in (lambda: fleet.run(["true"]), lambda: fleet.session()):
            with self.assertRaises(ServerError) as caught:
                request()
            self.assertEqual(caught.exception.kind, "resource_exhausted")
            message = str(caught.exception)
            self.assertTrue(message.startswith("no node of the fleet could take it: "), message)
            for endpoint in endpoints:
                self.assertIn(f"{endpoint}: unreachable: ", message)
        self.assertLess(time.monotonic() - began, AT_ONCE_SECONDS)
        self.assertEqual([node["endpoint"] for node in fleet.status()], endpoints)
        self.assertTrue(all(set(node) == {"endpoint", "error"} for node in fleet.status()))
        with self.assertRaises(ValueError):  # checked before any node is asked
            fleet.run()

    def test_room_by_capacity(self) -> None:
        def capacity(**fields: Any) -> Dict[str, Any]:
            return {"max_sandboxes": 8, "running": 2, "starting": 1, "draining": False,
                    "features": {"backends": ["namespace", "local"]},
                    "warm_idle": {"default": {"sandboxes": 1, "sessions": 0},
                                  "python-repl": {"sandboxes": 0, "sessions": 2}}, **fields}

        self.assertEqual(_room(capacity(), ()), (5 + 3 / 1e4, ""))
        self.assertEqual(_room(capacity(), ("namespace",))[0], 5 + 3 / 1e4)
        self.assertEqual(_room(capacity(), ("docker",)), (None, "has no docker backend"))
        self.assertEqual(_room(capacity(draining=True), ()), (None, "draining"))
        self.assertEqual(_room(capacity(running=7), ()), (None, "full (8 of 8)"))
        self.assertEqual(_room(capacity(max_sandboxes=0, running=5), ())[0], 1e9 - 6 + 3 / 1e4)
        # A malformed answer is read as best it can be, never raising.
        self.assertEqual(_room({"running": "x", "warm_idle": {"p": {"sandboxes": "y"}},
                                "features": None}, ()), (1e9, ""))
        # Warm counts are clamped to 0..1000 (two pools of -1.7e308 made the room -inf, which
        # placement neither picked nor passed over, forever); negative counts read as 0.
        self.assertEqual(_room(capacity(warm_idle={"a": {"sandboxes": -1.7e308,
                                                         "sessions": -1.7e308}}), ()),
                         (5.0, ""))
        self.assertEqual(_room(capacity(warm_idle={"a": {"sandboxes": 1.7e308}}), ()),
                         (5 + 1000 / 1e4, ""))
        self.assertEqual(_room(capacity(running=-3, starting=-1e308), ()), (8 + 3 / 1e4, ""))
        # What no finite room comes of is malformed: the node is passed over.
        malformed = (None, "its capacity answer is malformed")
        for fields in ({"warm_idle": {"a": {"sandboxes": math.nan}}},
                       {"warm_idle": {"a": {"sessions": -math.inf}}},
                       {"running": 10 ** 400}, {"max_sandboxes": 10 ** 400},
                       {"warm_idle": {"a": {"sandboxes": 10 ** 400}}},
                       {"max_sandboxes": 0, "running": 10 ** 308, "starting": 10 ** 308}):
            with self.subTest(fields=fields):
                self.assertEqual(_room(capacity(**fields), ()), malformed)
        for answer in (None, [1], "capacity", 7):
            with self.subTest(answer=answer):
                self.assertEqual(_room(answer, ()), malformed)


class SlurmFleetTest(unittest.TestCase):
    """``slurm:PORT``: the nodes of the Slurm job this runs in, from its node list expanded as
    Slurm writes it (the C++ client's Fleet.ASlurmNodeListExpandsAsSlurmWritesIt and
    Fleet.ASlurmJobsNodesAreAFleet); no server needed."""

    def test_a_node_list_expands_as_slurm_writes_it(self) -> None:
        for text, hosts in (
                ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
                ("rack[1-2]-n[8-10]",
                 ["rack1-n8", "rack1-n9", "rack1-n10", "rack2-n8", "rack2-n9", "rack2-n10"]),
                ("n[098-101]", ["n098", "n099", "n100", "n101"]),
                ("localhost", ["localhost"]),
                ("a.example.org,b_1", ["a.example.org", "b_1"]),
                (" n[1-2],\n m , ,", ["n1", "n2", "m"])):
            with self.subTest(text=text):
                self.assertEqual(expand_slurm_hostlist(text), hosts)
        hosts = expand_slurm_hostlist("n[1-100000]", max_hosts=100_000)
        self.assertEqual(len(hosts), 100_000)
        self.assertEqual((hosts[0], hosts[-1]), ("n1", "n100000"))

    def test_a_malformed_or_huge_node_list_is_refused_before_anything_is_made(self) -> None:
        for text in ("", "n[1-3", "n[3-1]", "n[a-b]", "n[1-2]x[", "n[0-999999999]",
                     "n[1-1000]m[1-1000]", "n[1-99999],m[1-2]", "bad host", "n/1", "n[-1]",
                     "n[1-1000000000000000000000]",
                     # Hosts without a range count too: no list gives more than max_hosts.
                     "n[1-100000],x", "n[1-2],h" + "x" * 253):
            with self.subTest(text=text):
                began = time.monotonic()
                with self.assertRaises(RlmSandboxError) as caught:
                    expand_slurm_hostlist(text, max_hosts=100_000)
                self.assertIn(f"the Slurm node list '{text[:200]}': ", str(caught.exception))
                self.assertLess(time.monotonic() - began, AT_ONCE_SECONDS)
        for text, why in (("n[1-3", "a '[' is not closed"), ("n[3-1]", "runs backwards"),
                          ("n[a-b]", "'[a-b]' is not numbers"), (" , ", "no hosts in it"),
                          ("bad host", "'bad host' is not a host name"),
                          ("n[0-999999999]", "more than 100000 hosts"),
                          ("h" + "x" * 252 + "[1-10]", "a host name of 254 bytes")):
            with self.subTest(why=why), self.assertRaises(RlmSandboxError) as caught:
                expand_slurm_hostlist(text)
            self.assertIn(why, str(caught.exception))
        with self.assertRaises(RlmSandboxError) as caught:
            expand_slurm_hostlist("x" * 300 + "[")
        self.assertIn("'" + "x" * 200 + "': ", str(caught.exception))  # the list, cut short

    def test_a_slurm_jobs_nodes_are_a_fleet(self) -> None:
        with mock.patch.dict(os.environ, {"SLURM_JOB_NODELIST": "node[1-3]"}):
            expected = ["tls://node1:7443", "tls://node2:7443", "tls://node3:7443"]
            self.assertEqual(read_fleet("slurm:7443"), expected)
            fleet = Fleet("slurm:7443")
            self.assertEqual((fleet.source, fleet.endpoints), ("slurm:7443", expected))
            os.environ["SLURM_JOB_NODELIST"] = "node[1-2]"
            self.assertEqual(fleet.refresh(), expected[:2])
            for bad in ("slurm:", "slurm:0", "slurm:65536", "slurm:74x3", "slurm:-1",
                        "slurm:123456", "slurm: 7443"):
                with self.subTest(source=bad), self.assertRaises(RlmSandboxError) as caught:
                    read_fleet(bad)
                self.assertEqual(str(caught.exception), f"fleet {bad}: expected slurm:PORT, "
                                                        f"the port of the nodes' TLS listeners")
            os.environ["SLURM_JOB_NODELIST"] = "node[1-3"
            with self.assertRaises(RlmSandboxError) as caught:
                read_fleet("slurm:7443")
            self.assertTrue(str(caught.exception).startswith(
                "fleet slurm:7443: the Slurm node list 'node[1-3': "), caught.exception)
        # A job step's list when the job's is unset or empty.
        with mock.patch.dict(os.environ, {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "gpu7"}):
            self.assertEqual(read_fleet("slurm:7443"), ["tls://gpu7:7443"])
        with mock.patch.dict(os.environ):
            os.environ.pop("SLURM_JOB_NODELIST", None)
            os.environ.pop("SLURM_NODELIST", None)
            with self.assertRaises(RlmSandboxError) as caught:
                read_fleet("slurm:7443")
            self.assertIn("SLURM_JOB_NODELIST is not set (is this inside a Slurm job's "
                          "allocation?)", str(caught.exception))
            with self.assertRaises(RlmSandboxError):
                Fleet("slurm:7443")


#: Fake nodes that answer their capacity badly, each with the reason placement passes it over
#: for (None: it looks fine, is picked, and refuses the request resource_exhausted).
BAD_NODES = (
    ("warm -1.7e308", dict(warm_idle='{"a":{"sandboxes":-1.7e308,"sessions":-1.7e308}}'),
     None),
    ("warm NaN", dict(warm_idle='{"a":{"sandboxes":NaN}}'), "unreachable: "),
    ("warm -Infinity", dict(warm_idle='{"a":{"sessions":-Infinity}}'), "unreachable: "),
    ("running Infinity", dict(running="Infinity"), "unreachable: "),
    ("running of 400 digits", dict(running="9" * 400), "its capacity answer is malformed"),
    ("warm of 400 digits", dict(warm_idle='{"a":{"sandboxes":' + "9" * 400 + "}}"),
     "its capacity answer is malformed"),
    ("held past a float", dict(max_sandboxes="0", running="1" + "0" * 308,
                               starting="1" + "0" * 308), "its capacity answer is malformed"),
    ("a reply of 70 KiB", dict(padding='"' + "x" * (70 << 10) + '"'),
     "unreachable: the server sent a frame of"),
)


class FakeNodes(unittest.TestCase):
    """Placement among nodes that answer their capacity badly (fake ones, threads of this
    process): each is passed over, and the placement ends."""

    def fakes(self) -> List[FakeNode]:
        nodes = []
        for _name, fields, _why in BAD_NODES:
            node = FakeNode(capacity_json(**fields))
            self.addCleanup(node.stop)
            nodes.append(node)
        trickling = FakeNode(trickle=True)
        self.addCleanup(trickling.stop)
        return nodes + [trickling]

    def within(self, seconds: float, call: Any) -> Any:
        """call() on a thread of its own; fails if it has not returned or raised in `seconds`."""
        box: Dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = call()
            except BaseException as error:  # noqa: BLE001 - reported by the test's thread
                box["error"] = error

        thread = threading.Thread(target=run, daemon=True)
        began = time.monotonic()
        thread.start()
        thread.join(seconds)
        self.assertFalse(thread.is_alive(), f"still placing after {seconds} s")
        box["elapsed"] = time.monotonic() - began
        return box

    def test_the_wire_refuses_nan_and_infinity(self) -> None:
        for constant in ("NaN", "Infinity", "-Infinity"):
            with self.subTest(constant=constant):
                mine, theirs = socket.socketpair()
                wire = Wire(mine)
                try:
                    theirs.sendall(frame(f'{{"op":"capacity","running":{constant}}}'.encode()))
                    with self.assertRaises(ServerError) as caught:
                        wire.receive()
                    self.assertEqual(caught.exception.kind, "internal")
                    self.assertIn(f"{constant} is not JSON", str(caught.exception))
                finally:
                    wire.close()
                    theirs.close()

    def test_a_reply_is_bounded_in_time_and_size_as_a_whole(self) -> None:
        mine, theirs = socket.socketpair()
        wire = Wire(mine)
        self.addCleanup(wire.close)
        self.addCleanup(theirs.close)
        theirs.sendall(struct.pack(">I", 1000) + b"{")
        began = time.monotonic()
        with self.assertRaises(ServerError) as caught:
            wire.receive(deadline=time.monotonic() + 0.5)
        self.assertEqual(caught.exception.kind, "unavailable")
        self.assertLess(time.monotonic() - began, AT_ONCE_SECONDS)
        other, peer = socket.socketpair()
        self.addCleanup(other.close)
        self.addCleanup(peer.close)
        peer.sendall(frame(b'{"op":"capacity","x":"' + b"x" * 100 + b'"}'))
        with self.assertRaises(ServerError) as caught:
            Wire(other).receive(max_bytes=64)
        self.assertIn("frame of", str(caught.exception))

    def test_bad_nodes_alone_are_each_passed_over(self) -> None:
        nodes = self.fakes()
        endpoints = [node.endpoint for node in nodes]
        reasons = [why for _name, _fields, why in BAD_NODES] + \
            ["unreachable: the server did not answer in time"]
        for choices in (1, 3, len(nodes)):
            with self.subTest(choices=choices):
                fleet = Fleet(endpoints, choices=choices, seed=choices)
                box = self.within(PASSED_OVER_SECONDS, lambda: fleet.run(["true"]))
                error = box.get("error")
                self.assertIsInstance(error, ServerError, box)
                self.assertEqual(error.kind, "resource_exhausted", str(error))
                message = str(error)
                for endpoint, why in zip(endpoints, reasons):
                    self.assertIn(f"{endpoint}: {why or 'a fake node takes nothing'}", message)
        # status(): each bad node's error, in ask_timeout each; the well-formed ones' capacity.
        box = self.within(PASSED_OVER_SECONDS + 5.0, Fleet(endpoints).status)
        status = box["result"]
        self.assertEqual([node["endpoint"] for node in status], endpoints)
        self.assertIn("did not answer in time", status[-1]["error"])
        self.assertIn("NaN is not JSON", status[1]["error"])
        self.assertIn("frame of", status[len(BAD_NODES) - 1]["error"])

    def test_a_trickling_node_is_cut_off_at_the_ask_timeout(self) -> None:
        node = FakeNode(trickle=True)
        self.addCleanup(node.stop)
        fleet = Fleet([node.endpoint], ask_timeout=1.0)
        box = self.within(PASSED_OVER_SECONDS, lambda: fleet.session())
        self.assertIsInstance(box.get("error"), ServerError, box)
        self.assertIn(f"{node.endpoint}: unreachable: the server did not answer in time",
                      str(box["error"]))
        self.assertGreaterEqual(box["elapsed"], 0.9)
        self.assertLess(box["elapsed"], 1.0 + AT_ONCE_SECONDS)
        for timeout in (0, -1, math.nan, math.inf, "2", True):
            with self.subTest(ask_timeout=timeout), self.assertRaises(ValueError):
                Fleet([node.endpoint], ask_timeout=timeout)


class BadNodesBesideAGoodOne(FleetTestCase):
    """Bad nodes beside a real one: placement passes them over and lands on the real one."""

    def test_placement_lands_on_the_healthy_node(self) -> None:
        registry = tempfile.mkdtemp(prefix="rlm-fleet-registry-")
        self.addCleanup(shutil.rmtree, registry, True)
        real = Node("n1", registry, NODE_FLAGS)
        self.addCleanup(real.stop)
        deadline = time.monotonic() + STARTUP_SECONDS
        while not real.registered():
            self.assertLess(time.monotonic(), deadline, real.log())
            time.sleep(0.1)
        fakes = FakeNodes.fakes(self)  # type: ignore[arg-type]
        endpoints = [node.endpoint for node in fakes] + [f"unix:{real.socket}"]
        for choices in (1, 2, len(endpoints)):
            for seed in range(3):
                with self.subTest(choices=choices, seed=seed):
                    fleet = Fleet(endpoints, choices=choices, seed=seed)
                    box = FakeNodes.within(self, PASSED_OVER_SECONDS,  # type: ignore[arg-type]
                                           lambda: fleet.run(["/bin/echo", "hi"]))
                    self.assertNotIn("error", box, box)
                    self.assertEqual((box["result"].node, box["result"].stdout), ("n1", "hi\n"))
        session = Fleet(endpoints, choices=2, seed=11).session("python-repl")
        self.addCleanup(ServerSession._discard, session)
        self.assertEqual(session.node, "n1")
        self.assertEqual(session.execute("print(6 * 7)").stdout, "42\n")
        self.assertEqual(session.close().get("status"), "ok")


class FleetPlacementTest(FleetTestCase):
    """Sessions and runs placed across three nodes of 8 slots each."""

    def test_sessions_spread_and_a_dead_node_is_passed_over(self) -> None:
        nodes = self.start_nodes()
        fleet = Fleet(self.registry)
        self.assertEqual(fleet.endpoints, [f"unix:{node.socket}" for node in nodes])
        sessions = self.open_sessions(fleet, 24)
        for number, session in enumerate(sessions):
            self.assertEqual(session.execute(f"x = {number}").status, "ok")
            self.assertTrue(session.session_id.startswith(session.node + "/"), session)
        self.assertEqual(by_node(sessions), {"n1": 8, "n2": 8, "n3": 8})
        for node in fleet.status():
            self.assertEqual((node["running"], node["max_sandboxes"]), (8, 8), node)
        error = self.refused("resource_exhausted", lambda: fleet.session("python-repl"))
        self.assertIn("no node of the fleet could take it", str(error))
        for node in nodes:
            self.assertIn(f"unix:{node.socket}: full (8 of 8)", str(error))
        self.refused("resource_exhausted", lambda: fleet.run(["true"]))

        # n3 dies without a word: each of its sessions' next cell says node_lost at once.
        nodes[2].kill_hard()
        lost = 0
        for number, session in enumerate(sessions):
            if session.node != "n3":
                self.assertEqual(session.execute("print(x)").stdout, f"{number}\n")
                continue
            began = time.monotonic()
            with self.assertRaises(ServerError) as caught:
                session.execute("print(x)")
            elapsed = time.monotonic() - began
            self.assertLess(elapsed, LOST_SECONDS, f"node_lost only after {elapsed:.1f} s")
            self.assertEqual(caught.exception.kind, "node_lost", str(caught.exception))
            self.assertIn("node_lost: node n3 is gone", str(caught.exception))
            self.assertFalse(session.running)
            # Every later call says so too, without asking anyone.
            with self.assertRaises(ServerError) as again:
                session.snapshot()
            self.assertEqual(again.exception.kind, "node_lost")
            self.assertIn("the session is over: node_lost: node n3", str(again.exception))
            lost += 1
        self.assertEqual(lost, 8)
        for session in sessions:
            closed = session.close()
            if session.node == "n3":
                self.assertEqual(closed["status"], "sandbox_error", closed)
                self.assertIn("node_lost: node n3", closed["detail"])
            else:
                self.assertEqual(closed.get("status"), "ok", closed)

        # SIGKILL left n3's endpoint file: the fleet still lists it, and passes it over.
        self.assertTrue(os.path.exists(nodes[2].endpoint_file))
        fleet = Fleet(self.registry)
        self.assertEqual(len(fleet.endpoints), 3)
        again = self.open_sessions(fleet, 16)
        self.assertEqual(by_node(again), {"n1": 8, "n2": 8})
        for session in again:
            self.assertEqual(session.execute("print('here')").stdout, "here\n")
        error = self.refused("resource_exhausted", lambda: fleet.session("python-repl"))
        self.assertIn(f"unix:{nodes[2].socket}: unreachable", str(error))

        # status(): the dead node with its error, the others with their capacity.
        status = fleet.status()
        self.assertEqual([node["endpoint"] for node in status],
                         [f"unix:{node.socket}" for node in nodes])
        self.assertEqual(set(status[2]), {"endpoint", "error"})
        self.assertIn(nodes[2].socket, status[2]["error"])
        for node_id, node in zip(("n1", "n2"), status[:2]):
            self.assertEqual((node["node_id"], node["running"]), (node_id, 8), node)
            self.assertNotIn("op", node)
        for session in again:
            self.assertEqual(session.close().get("status"), "ok")

        # A clean stop removes the node's endpoint file.
        nodes[0].proc.send_signal(signal.SIGINT)
        self.assertEqual(nodes[0].exit_code(), 0, nodes[0].log())
        self.assertFalse(os.path.exists(nodes[0].endpoint_file))
        self.assertEqual(fleet.refresh(), [f"unix:{nodes[1].socket}", f"unix:{nodes[2].socket}"])

    def test_a_drained_node_gets_nothing_new_while_its_session_finishes(self) -> None:
        nodes = self.start_nodes("--drain-grace", "10m")
        fleet = Fleet(self.registry)
        sessions = self.open_sessions(fleet, 3, workers=1)
        self.assertEqual(by_node(sessions), {"n1": 1, "n2": 1, "n3": 1})
        held = next(session for session in sessions if session.node == "n1")
        self.assertEqual(held.execute("x = 20").status, "ok")
        self.assertEqual(Server(nodes[0].socket).drain()["node"], "n1")

        placed = [fleet.run(["/bin/echo", "hi"]) for _ in range(6)]
        self.assertTrue(all(result.status == "ok" and result.stdout == "hi\n"
                            for result in placed), placed)
        self.assertNotIn("n1", by_node(placed))
        more = self.open_sessions(fleet, 6, workers=1)
        self.assertNotIn("n1", by_node(more))
        status = {node.get("node_id"): node for node in fleet.status()}
        self.assertIs(status["n1"]["draining"], True)
        self.assertEqual(status["n1"]["running"], 1)

        # The session on the drained node goes on, then the node exits 0 and unregisters.
        self.assertEqual(held.execute("print(x + 22)").stdout, "42\n")
        for session in sessions + more:
            self.assertEqual(session.execute("print(1)").stdout, "1\n", session)
            self.assertEqual(session.close().get("status"), "ok", session)
        self.assertEqual(nodes[0].exit_code(), 0, nodes[0].log())
        self.assertFalse(os.path.exists(nodes[0].endpoint_file))
        self.assertEqual(fleet.refresh(), [f"unix:{nodes[1].socket}", f"unix:{nodes[2].socket}"])

    def test_a_run_whose_node_dies_is_not_started_again(self) -> None:
        nodes = self.start_nodes()
        fleet = Fleet(self.registry)
        box: Dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = fleet.run(["/bin/sleep", "120"])
            except BaseException as error:  # noqa: BLE001 - checked on the test's thread
                box["error"] = error

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + SETTLE_SECONDS
        holder: Optional[Node] = None
        while holder is None:
            self.assertLess(time.monotonic(), deadline, "the run never started")
            for node, status in zip(nodes, fleet.status()):
                if status.get("running") == 1:
                    holder = node
            time.sleep(0.05)
        holder.kill_hard()
        thread.join(LOST_SECONDS + 1.0)
        self.assertFalse(thread.is_alive(), "the run did not end with its node")
        self.assertNotIn("result", box)
        error = box["error"]
        self.assertIsInstance(error, ServerError)
        self.assertEqual(error.kind, "node_lost", str(error))
        self.assertIn(f"node_lost: the server at {holder.socket} is gone", str(error))
        # Not placed again: the other nodes run nothing.
        time.sleep(1.0)
        for node in nodes:
            if node is not holder:
                self.assertEqual(node.server.capacity()["running"], 0, node.node_id)

    def test_thirty_runs_on_twenty_four_slots(self) -> None:
        self.start_nodes()
        fleet = Fleet(self.registry)
        start = threading.Barrier(30)
        outcomes: List[Optional[str]] = [None] * 30
        elapsed: List[float] = [0.0] * 30

        def run(index: int) -> None:
            start.wait(SETTLE_SECONDS)
            began = time.monotonic()
            try:
                result = fleet.run(["/bin/sleep", "5"])
                outcomes[index] = (f"ok:{result.node}" if result.status == "ok"
                                   else f"{result.status}: {result.detail}")
            except ServerError as error:
                outcomes[index] = error.kind
            except BaseException as error:  # noqa: BLE001 - reported by the test's thread
                outcomes[index] = f"{type(error).__name__}: {error}"
            elapsed[index] = time.monotonic() - began

        threads = [threading.Thread(target=run, args=(index,), daemon=True)
                   for index in range(30)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + SETTLE_SECONDS * 2
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.assertFalse(any(thread.is_alive() for thread in threads),
                         f"a run hung: {outcomes}")
        counts = collections.Counter(outcome.split(":")[0] for outcome in outcomes)
        self.assertEqual(counts, {"ok": 24, "resource_exhausted": 6}, outcomes)
        self.assertEqual(collections.Counter(outcome for outcome in outcomes
                                             if outcome.startswith("ok:")),
                         {"ok:n1": 8, "ok:n2": 8, "ok:n3": 8}, outcomes)
        # The refusals came at once, not after a run ended and gave its slot back.
        for outcome, seconds in zip(outcomes, elapsed):
            if outcome == "resource_exhausted":
                self.assertLess(seconds, AT_ONCE_SECONDS, outcomes)
        self.assertEqual(fleet.run(["/bin/echo", "after"]).stdout, "after\n")


if __name__ == "__main__":
    unittest.main()
