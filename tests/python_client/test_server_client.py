"""The rlm_sandbox package's server client (python/rlm_sandbox/server.py) against a real
``rlm-sandbox serve`` started by this module (and stopped, leaving nothing, at its end).

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_server_client`` from
tests/python_client (ctest's ``python_server_client`` test does this).
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Dict, List, Optional, Sequence
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import rlm_sandbox  # noqa: E402
from rlm_sandbox import (RlmSandbox, RlmSandboxError, Server, ServerError,  # noqa: E402
                         ServerSession)
from test_rlm_sandbox_client import (SAVED_STATE_CELL, SAVED_STATE_CHECK,  # noqa: E402
                                     SAVED_STATE_OUTPUT, UNSAVEABLE_CELL, ForkChecks,
                                     tampered_copy)

BINARY = os.environ.get("RLM_SANDBOX_BIN") or shutil.which("rlm-sandbox")
_server: Optional[subprocess.Popen] = None
_dir: Optional[str] = None
SOCKET = ""
PERMITTED = ""


def _wait_for_socket(path: str, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rlm-sandbox serve exited with {proc.returncode}: "
                               f"{proc.stderr.read().decode(errors='replace')}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            return
        except OSError:
            time.sleep(0.05)
        finally:
            probe.close()
    raise RuntimeError(f"rlm-sandbox serve did not listen on {path} within {seconds} s")


def setUpModule() -> None:  # noqa: N802 - unittest's name
    global _server, _dir, SOCKET, PERMITTED
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")
    _dir = tempfile.mkdtemp(prefix="rlm-server-client-")
    os.chmod(_dir, 0o755)
    SOCKET = os.path.join(_dir, "server.sock")
    PERMITTED = os.path.join(_dir, "permitted")
    os.mkdir(PERMITTED)
    with open(os.path.join(PERMITTED, "note.txt"), "w") as note:
        note.write("from the host\n")
    _server = _serve(SOCKET)
    try:
        _wait_for_socket(SOCKET, _server, 60)
    except BaseException:
        tearDownModule()
        raise


def _serve(path: str, pools: Sequence[str] = ("--pool", "default=1",
                                                "--session-pool", "python-repl=1")
           ) -> subprocess.Popen:
    """``rlm-sandbox serve`` at `path` with these pools (default: the module's server's)."""
    return subprocess.Popen(
        [BINARY, "serve", "--socket", path, *pools,
         "--permit-bind", f"{os.getuid()}:{PERMITTED}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(server: Optional[subprocess.Popen]) -> None:
    if server is not None and server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if server is not None and server.stderr is not None:
        server.stderr.close()


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    _stop(_server)
    if _dir is not None:
        shutil.rmtree(_dir, ignore_errors=True)


class RunTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server(SOCKET)

    def test_hello_lists_the_offered_policies(self) -> None:
        hello = self.server.hello()
        self.assertIn("default", hello["policies"])
        self.assertIn("python-repl", hello["policies"])
        self.assertEqual(hello["pid"], _server.pid)

    def test_command_output_comes_through_the_clients_own_pipes(self) -> None:
        result = self.server.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual(result.status, "exit_nonzero", result)
        self.assertEqual(result.exit_code, 3)
        self.assertEqual(result.stdout, "out\n")
        self.assertEqual(result.stderr, "err\n")
        self.assertEqual(result.backend, "namespace")

    def test_code_with_stdin_env_and_sandbox_identity(self) -> None:
        result = self.server.run(
            code="import os, sys\nprint(sys.stdin.read().upper(), os.environ['GREETING'], "
                 "os.getuid(), open('/proc/1/cmdline','rb').read().split(b'\\0')[0])",
            env={"GREETING": "hi"}, stdin="piped in")
        self.assertEqual(result.status, "ok", result)
        self.assertIn("PIPED IN hi 1000", result.stdout)
        self.assertIn("rlm-sandbox-init", result.stdout)

    def test_output_beyond_the_policys_cap_is_truncated_and_stops_the_run(self) -> None:
        policy = self.server.policy("default")
        cap = 4096
        result = self.server.run(["sh", "-c", "yes 0123456789 | head -c 1000000; sleep 30"],
                                 limits={"output_bytes": cap})
        self.assertEqual(result.status, "output_limit", result)
        self.assertTrue(result.stdout_truncated)
        self.assertEqual(len(result.stdout), cap)
        self.assertLess(result.wall_ms, 20000)
        self.assertGreater(policy["limits"]["output_bytes"], cap)

    def test_timeout_tightens_the_policy(self) -> None:
        result = self.server.run(["sleep", "30"], timeout=0.5)
        self.assertEqual(result.status, "timeout", result)

    def test_permitted_bind_is_readable_inside(self) -> None:
        policy = self.server.policy("default")
        policy["filesystem"]["mounts"].append(
            {"type": "bind", "source": PERMITTED, "target": "/data", "readonly": True,
             "optional": False})
        result = self.server.run(["cat", "/data/note.txt"], overrides=policy)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, "from the host\n")


class RefusalTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server(SOCKET)

    def test_no_server_at_the_socket_is_unavailable(self) -> None:
        with self.assertRaises(ServerError) as caught:
            Server(os.path.join(_dir, "nobody.sock")).run(["true"])
        self.assertEqual(caught.exception.kind, "unavailable")

    def test_policy_not_offered_is_refused(self) -> None:
        with self.assertRaises(ServerError) as caught:
            self.server.run(["true"], policy="strict")
        self.assertEqual(caught.exception.kind, "refused")
        self.assertIn("not offered", str(caught.exception))

    def test_loosened_limit_is_refused_with_its_path(self) -> None:
        with self.assertRaises(ServerError) as caught:
            self.server.run(["true"], limits={"memory_bytes": 8 << 30})
        self.assertEqual(caught.exception.kind, "refused")
        self.assertIn("limits.memory_bytes", [path for path, _ in caught.exception.diagnostics])

    def test_bind_outside_what_is_permitted_is_refused(self) -> None:
        policy = self.server.policy("default")
        policy["filesystem"]["mounts"].append(
            {"type": "bind", "source": "/etc", "target": "/hostetc", "readonly": True,
             "optional": False})
        with self.assertRaises(ServerError) as caught:
            self.server.run(["ls", "/hostetc"], overrides=policy)
        self.assertEqual(caught.exception.kind, "refused")
        paths: List[str] = [path for path, _ in caught.exception.diagnostics]
        self.assertTrue(any(p.endswith(".source") for p in paths), paths)

    def test_writable_bind_of_a_read_only_permission_is_refused(self) -> None:
        policy = self.server.policy("default")
        policy["filesystem"]["mounts"].append(
            {"type": "bind", "source": PERMITTED, "target": "/data", "readonly": False,
             "optional": False})
        with self.assertRaises(ServerError) as caught:
            self.server.run(["touch", "/data/x"], overrides=policy)
        self.assertIn("readonly", str(caught.exception))
        self.assertFalse(os.path.exists(os.path.join(PERMITTED, "x")))


# An interpreter uid 65534 may run (this one may live in root's home).
_NOBODY_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# A process as uid 65534 listening at argv[1] (bound before any real server): for each connection
# it reads until the client sent one whole frame or hung up, closes it, and prints "BYTES FDS".
_IMPOSTOR = r"""
import os, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    data, fds = b"", 0
    while True:
        chunk, passed, _flags, _addr = socket.recv_fds(conn, 65536, 16)
        for fd in passed:
            os.close(fd)
        fds += len(passed)
        if not chunk:
            break
        data += chunk
        if len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
            break
    conn.close()
    print(len(data), fds, flush=True)
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root to start a process as uid 65534")
class ImpostorTest(unittest.TestCase):
    """A listener of another uid at the socket path (another tenant who bound it first) would get
    the payload's stdio fds and could forge its output: the client refuses it, sending nothing."""

    def setUp(self) -> None:
        saved_uid = os.environ.pop("RLM_SANDBOX_SERVER_UID", None)
        if saved_uid is not None:
            self.addCleanup(os.environ.__setitem__, "RLM_SANDBOX_SERVER_UID", saved_uid)
        else:
            self.addCleanup(os.environ.pop, "RLM_SANDBOX_SERVER_UID", None)
        self.dir = tempfile.mkdtemp(prefix="rlm-impostor-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.chmod(self.dir, 0o777)  # where uid 65534 may bind
        self.path = os.path.join(self.dir, "s.sock")
        self.proc = subprocess.Popen(
            [_NOBODY_PYTHON, "-c", _IMPOSTOR, self.path], user=65534, group=65534,
            extra_groups=[], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        self.addCleanup(self._stop)
        self.assertEqual(self.proc.stdout.readline(), b"ready\n")

    def _stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def received(self) -> List[int]:
        """[bytes, fds] the impostor received on its next connection."""
        return [int(word) for word in self.proc.stdout.readline().split()]

    def refusal(self) -> str:
        return (f"the process listening at {self.path} runs as uid 65534, not root or you; "
                f"refusing to send it anything (set RLM_SANDBOX_SERVER_UID=65534 if it is yours)")

    def test_a_listener_of_another_uid_is_refused(self) -> None:
        with self.assertRaises(ServerError) as caught:
            Server(self.path).run(["echo", "hi"], stdin="input")
        self.assertEqual(caught.exception.kind, "unavailable")
        self.assertEqual(str(caught.exception), self.refusal())
        self.assertEqual(self.received(), [0, 0])
        with self.assertRaises(ServerError) as caught:
            RlmSandbox(server=self.path)
        self.assertEqual(str(caught.exception), self.refusal())
        self.assertEqual(self.received(), [0, 0])

    def test_a_server_uid_the_client_is_told_to_expect_is_used(self) -> None:
        with self.assertRaises(ServerError) as caught:
            Server(self.path, server_uid=65534).run(["echo", "hi"])
        self.assertIn("closed the connection", str(caught.exception))
        sent, fds = self.received()
        self.assertGreater(sent, 4)
        self.assertEqual(fds, 3)  # the payload's stdin, stdout and stderr
        os.environ["RLM_SANDBOX_SERVER_UID"] = "65534"
        with self.assertRaises(ServerError) as caught:
            Server(self.path).hello()
        self.assertNotIn("refusing", str(caught.exception))
        self.assertGreater(self.received()[0], 4)

    def test_a_root_server_is_used_by_a_client_of_another_uid(self) -> None:
        sock = os.path.join(self.dir, "root.sock")
        server = subprocess.Popen(
            [BINARY, "serve", "--socket", sock, "--pool", "default=0", "--socket-mode", "0666",
             "--allow-uid", "65534"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_for_socket(sock, server, 60)
            package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
            client = subprocess.run(
                [_NOBODY_PYTHON, "-c",
                 "import sys; sys.path.insert(0, sys.argv[1]); from rlm_sandbox import Server; "
                 "print(Server(sys.argv[2]).hello()['policies'])", package, sock],
                user=65534, group=65534, extra_groups=[], capture_output=True, timeout=120,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
            self.assertIn("default", client.stdout.decode(), client.stderr.decode())
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            server.stderr.close()


class SessionTest(unittest.TestCase):
    def session(self, **options) -> ServerSession:
        session = Server(SOCKET).session("python-repl", **options)
        self.addCleanup(session.close)
        return session

    def test_state_persists_and_llm_query_reaches_the_callback(self) -> None:
        asked = []

        def answer(prompt: str, model: Optional[str]) -> str:
            asked.append((prompt, model))
            return prompt[::-1]

        sb = self.session(context="the context", on_llm_query=answer)
        self.assertEqual(sb.execute("x = llm_query('abc')").status, "ok")
        result = sb.execute("print(x, context)")
        self.assertEqual(result.stdout, "cba the context\n")
        self.assertEqual(asked, [("abc", None)])

    def test_callback_error_is_an_error_text_in_the_cell(self) -> None:
        def fail(prompt: str, model: Optional[str]) -> str:
            raise ValueError("no model here")

        sb = self.session(on_llm_query=fail)
        result = sb.execute("print(llm_query('q'))")
        self.assertEqual(result.status, "ok")
        self.assertEqual(result.stdout, "Error: no model here\n")

    def test_rlm_query_and_message_prompts_reach_their_callbacks(self) -> None:
        seen: List[Any] = []
        sb = self.session(on_llm_query=lambda prompt, model: seen.append(prompt) or "llm",
                          on_rlm_query=lambda prompt, model: f"rlm:{prompt}")
        messages = [{"role": "user", "content": "hi"}]
        result = sb.execute(f"print(llm_query({messages!r}), rlm_query('sub'))")
        self.assertEqual(result.stdout, "llm rlm:sub\n")
        self.assertEqual(seen, [messages])

    def test_llm_limits_are_session_options(self) -> None:
        sb = self.session(llm_budget=2, llm_concurrency=1, llm_timeout=30,
                          on_llm_query=lambda prompt, model: "ok")
        result = sb.execute("print(llm_query_batched(['a', 'b', 'c']))")
        answers = ast.literal_eval(result.stdout)
        self.assertEqual(answers[:2], ["ok", "ok"])
        self.assertTrue(answers[2].startswith("Error: "), answers)
        with self.assertRaises(ServerError):  # only tightening: above the server's own
            self.session(llm_budget=10 ** 12)

    def test_tools_echo_locals_and_fetch(self) -> None:
        sb = self.session(echo=False, tools={
            "add": {"tool": lambda a, b=0: {"sum": a + b}, "description": "adds"},
            "table": [1, 2, 3], "broken": lambda: object()})
        result = sb.execute("r = add(2, b=3)\nprint(r, table)\nr", locals=True, fetch="r")
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, "{'sum': 5} [1, 2, 3]\n")  # no echo of the last line
        self.assertIn({"name": "r", "type": "dict", "repr": "{'sum': 5}", "value": {"sum": 5}},
                      result.locals)
        self.assertEqual(result.fetched, {"value": {"sum": 5}})
        result = sb.execute("broken()")
        self.assertIn("tool 'broken' returned a value that is not JSON", result.error)

    def test_python_encoded_tools_through_the_server(self) -> None:
        def lookup(key: tuple) -> dict:
            if key == ("missing",):
                raise KeyError(key)
            return {"z": key, "a": {1, 2}}

        sb = self.session(tools={"lookup": lookup, "order": {"b": 1, "a": (2,)}},
                          tool_encoding="python")
        result = sb.execute("r = lookup(('x', 1))\nprint(list(r), r['z'], r['a'], order)\n"
                            "try:\n    lookup(('missing',))\nexcept KeyError as e:\n"
                            "    print(repr(e))")
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, "['z', 'a'] ('x', 1) {1, 2} {'b': 1, 'a': (2,)}\n"
                                        "KeyError(('missing',))\n")

    def test_add_context_and_history(self) -> None:
        sb = self.session(context="first")
        self.assertEqual(sb.add_context({"k": "v"}), 1)
        self.assertEqual(sb.add_context("x" * (2 << 20), index=3), 3)
        self.assertEqual(sb.add_history([{"role": "user", "content": "q"}]), 0)
        result = sb.execute("print(context, context_1['k'], len(context_3), history[0]['role'])")
        self.assertEqual(result.stdout, "first v 2097152 user\n")

    def test_snapshot_restore_and_close(self) -> None:
        sb = self.session(context={"k": [1, 2]})
        self.assertEqual(sb.execute("n = len(context['k'])").status, "ok")
        snap = sb.snapshot()
        sb.execute("n = 100")
        sb.restore(snap)
        self.assertEqual(sb.execute("print(n)").stdout, "2\n")
        closed = sb.close()
        self.assertIn("status", closed)
        with self.assertRaises(RlmSandboxError):
            sb.execute("1")

    def test_narrow_network_is_a_frame_the_server_checks(self) -> None:
        sb = self.session()
        with self.assertRaisesRegex(ServerError, "no egress allowlist"):
            sb.narrow_network(["pypi.org:443"])  # python-repl's network is none
        with self.assertRaises(TypeError):
            sb.narrow_network("pypi.org:443")  # type: ignore[arg-type]
        self.assertEqual(sb.execute("print(1)").stdout, "1\n")

    def test_rlm_sandbox_takes_a_server(self) -> None:
        with RlmSandbox(server=SOCKET, context="ctx", timeout=20) as sb:
            self.assertIsNone(sb.pid)  # no local process
            self.assertEqual(sb.execute("print(context * 2)").stdout, "ctxctx\n")
            self.assertEqual(sb.backend, "namespace")
        with self.assertRaises(ValueError):
            RlmSandbox(server=SOCKET, lm="echo")

    def test_rlm_sandbox_server_from_the_environment(self) -> None:
        os.environ["RLM_SANDBOX_SERVER"] = SOCKET
        try:
            with RlmSandbox() as sb:
                self.assertEqual(sb.execute("print(1 + 1)").stdout, "2\n")
        finally:
            del os.environ["RLM_SANDBOX_SERVER"]

    def test_loosened_session_is_refused(self) -> None:
        with self.assertRaises(ServerError) as caught:
            ServerSession(SOCKET, "python-repl", memory="64G")
        self.assertIn("limits.memory_bytes", [path for path, _ in caught.exception.diagnostics])


class SaveLoadTest(unittest.TestCase):
    """Save through one server, load through a second server process started with the same
    options (another sandbox host: nothing but the file passes between them). Their sessions
    are all opened cold (no warm session pool): a warm session's file is refused by a cold one
    today (test_a_warm_sessions_file_loads_into_a_cold_session)."""

    FIRST = ""
    SECOND = ""
    servers: List[subprocess.Popen] = []
    POOLS = ("--pool", "default=0", "--session-pool", "python-repl=0")

    @classmethod
    def setUpClass(cls) -> None:  # noqa: N802 - unittest's name
        cls.FIRST = os.path.join(_dir, "first.sock")
        cls.SECOND = os.path.join(_dir, "second.sock")
        cls.servers = []
        try:
            for path in (cls.FIRST, cls.SECOND):
                cls.servers.append(_serve(path, cls.POOLS))
                _wait_for_socket(path, cls.servers[-1], 60)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:  # noqa: N802 - unittest's name
        for server in cls.servers:
            _stop(server)

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlm-server-save-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "run.save")

    def session(self, socket: str = "", **options: Any) -> ServerSession:
        session = Server(socket or self.FIRST).session("python-repl", **options)
        self.addCleanup(session.close)
        return session

    def saved_session(self) -> ServerSession:
        sb = self.session(context="ctx")
        self.assertEqual(sb.execute(SAVED_STATE_CELL).status, "ok")
        result = sb.save(self.path)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.saved["bytes"], os.path.getsize(self.path))
        self.assertEqual([(item["name"], item["type"]) for item in result.saved["skipped"]],
                         [("numbers", "generator")])
        return sb

    def test_state_moves_to_a_second_server(self) -> None:
        self.saved_session()
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)
        self.assertEqual(os.listdir(self.dir), ["run.save"])  # the temporary file was renamed
        self.assertNotEqual(Server(self.SECOND).hello()["pid"], Server(self.FIRST).hello()["pid"])
        fresh = self.session(self.SECOND)
        self.assertEqual(fresh.execute("y = 1").status, "ok")
        result = fresh.load(self.path)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(fresh.execute(SAVED_STATE_CHECK).stdout, SAVED_STATE_OUTPUT)
        self.assertIn("NameError", fresh.execute("y").error)  # load replaced the state

    def test_restore_from_opens_a_session_holding_the_state(self) -> None:
        self.saved_session()
        for restored in (ServerSession.restore_from(self.path, self.SECOND),
                         Server(self.SECOND).restore_session(self.path),
                         RlmSandbox.restore_from(self.path, server=self.SECOND)):
            self.addCleanup(restored.close)
            self.assertEqual(restored.execute(SAVED_STATE_CHECK).stdout, SAVED_STATE_OUTPUT)

    def test_rlm_sandbox_with_a_server_saves(self) -> None:
        with RlmSandbox(server=self.FIRST) as sb:
            self.assertEqual(sb.execute("x = 7").status, "ok")
            self.assertTrue(sb.save(self.path).ok)
        with RlmSandbox(server=self.SECOND) as sb:
            self.assertTrue(sb.load(self.path).ok)
            self.assertEqual(sb.execute("print(x)").stdout, "7\n")

    def test_a_tampered_file_is_refused_and_the_session_goes_on(self) -> None:
        self.saved_session()
        tampered = tampered_copy(self.path)
        sb = self.session(self.SECOND)
        self.assertEqual(sb.execute("x = 'mine'").status, "ok")
        with self.assertRaisesRegex(ServerError, "SHA-256"):
            sb.load(tampered)
        self.assertEqual(sb.execute("print(x)").stdout, "mine\n")
        with self.assertRaisesRegex(RlmSandboxError, "cannot open the save file"):
            sb.load(os.path.join(self.dir, "missing.save"))

    def test_restore_from_a_tampered_file_closes_the_new_session(self) -> None:
        self.saved_session()
        tampered = tampered_copy(self.path)
        closed: List[ServerSession] = []
        real_close = ServerSession.close

        def recorded_close(session: ServerSession) -> Dict[str, Any]:
            closed.append(session)
            return real_close(session)

        with mock.patch.object(ServerSession, "close", recorded_close), \
                self.assertRaisesRegex(ServerError, "SHA-256"):
            ServerSession.restore_from(tampered, self.SECOND)
        self.assertEqual(len(closed), 1)
        self.assertFalse(closed[0].running)

    def test_a_failed_save_leaves_no_partial_file_and_the_old_file_as_it_was(self) -> None:
        sb = self.session()
        self.assertEqual(sb.execute("x = 1").status, "ok")
        self.assertTrue(sb.save(self.path).ok)
        with open(self.path, "rb") as good:
            before = good.read()
        self.assertEqual(sb.execute(UNSAVEABLE_CELL).status, "ok")
        result = sb.save(self.path)
        self.assertEqual(result.status, "error", result)
        self.assertIn("cannot be saved together", result.error)
        self.assertEqual(os.listdir(self.dir), ["run.save"])
        with open(self.path, "rb") as kept:
            self.assertEqual(kept.read(), before)
        with self.assertRaisesRegex(RlmSandboxError, "cannot create a file"):
            sb.save(os.path.join(self.dir, "no-such-dir", "run.save"))
        self.assertEqual(sb.execute("print(x)").stdout, "1\n")

    def test_a_warm_sessions_file_loads_into_a_cold_session(self) -> None:
        # The save file names the policy as given, not the session's lifetime (a warm pool's is
        # its own), so a warm session's file loads into a cold session and into the repl.
        warm = Server(SOCKET)
        deadline = time.monotonic() + 60
        while warm.hello()["pools"]["python-repl"]["ready_sessions"] < 1:
            self.assertLess(time.monotonic(), deadline, "no warm session")
            time.sleep(0.05)
        taken = warm.hello()["pools"]["python-repl"]["warm_sessions"]
        sb = warm.session("python-repl")
        self.addCleanup(sb.close)
        self.assertEqual(warm.hello()["pools"]["python-repl"]["warm_sessions"], taken + 1)
        self.assertEqual(sb.execute("x = 3").status, "ok")
        self.assertTrue(sb.save(self.path).ok)
        cold = self.session(self.SECOND)
        self.assertTrue(cold.load(self.path).ok)
        self.assertEqual(cold.execute("print(x)").stdout, "3\n")


class ServerForkTest(ForkChecks, unittest.TestCase):
    """ServerSession.fork: the branches are sessions of the same server (the module's, with a
    warm session pool: a fork's branches are warm and cold sessions alike)."""

    branch_class = ServerSession

    def make_parent(self, **options: Any) -> ServerSession:
        session = Server(SOCKET).session("python-repl", **options)
        self.addCleanup(session.close)
        return session

    def test_branches_open_with_the_parents_policy_and_options_but_the_context(self) -> None:
        server = Server(SOCKET)
        parent = server.session("python-repl", context="ctx", echo=False, timeout=20,
                                llm_budget=5, tools={"double": lambda v: 2 * v},
                                on_llm_query=lambda prompt, model: f"first:{prompt}")
        self.addCleanup(parent.close)
        self.assertEqual(parent.execute("x = 21").status, "ok")
        parent.on_llm_query = lambda prompt, model: f"now:{prompt}"  # as the parent answers now
        opened: List[Any] = []
        real_init = ServerSession.__init__

        def init(session: ServerSession, *args: Any, **kwargs: Any) -> None:
            opened.append((args, kwargs))
            real_init(session, *args, **kwargs)

        with mock.patch.object(ServerSession, "__init__", init):
            branches = self.fork(parent, 2)
        self.assertEqual(len(opened), 2)
        for args, kwargs in opened:
            self.assertEqual(args, (server, "python-repl"))  # the same Server object
            self.assertIsNone(kwargs.get("context"))  # the state brings it
            self.assertIsNone(kwargs.get("context_file"))
            self.assertEqual((kwargs["timeout"], kwargs["llm_budget"], kwargs["echo"]),
                             (20, 5, False))
        for branch in branches:
            self.assertEqual(branch.backend, "namespace")
            result = branch.execute("print(double(x), llm_query('q'), context)\nx")
            self.assertEqual(result.stdout, "42 now:q ctx\n")  # and no echo of the last line

    def test_rlm_sandbox_with_a_server_forks_through_it(self) -> None:
        with RlmSandbox(server=SOCKET, context="ctx") as parent:
            self.assertEqual(parent.execute("x = 5").status, "ok")
            with mock.patch.object(ServerSession, "_fork", autospec=True,
                                   side_effect=ServerSession._fork) as fork:
                branches = self.fork(parent, 2)
            fork.assert_called_once_with(parent._remote, 2, None)  # the server session's fork
            for branch in branches:
                self.assertIsInstance(branch, RlmSandbox)
                self.assertIsInstance(branch._remote, ServerSession)
                self.assertIsNone(branch.pid)
                self.assertEqual(branch.policy, "python-repl")
                self.assertEqual(branch.execute("print(x, context)").stdout, "5 ctx\n")


    def test_the_rlm_environment_forks_through_a_server(self) -> None:
        from rlm_sandbox.integrations.rlm import RlmSandboxREPL  # noqa: PLC0415

        env = RlmSandboxREPL(context_payload="doc", server=SOCKET,
                             subcall_fn=lambda prompt, model: f"sub:{prompt}")
        self.addCleanup(env.cleanup)
        env.execute_code("seen = []")
        branches = env.fork(2)
        for branch in branches:
            self.addCleanup(branch.cleanup)
        for index, branch in enumerate(branches):
            self.assertIsInstance(branch._sandbox._remote, ServerSession)
            result = branch.execute_code(f"seen.append(rlm_query('q{index}'))\n"
                                         f"print(seen, context)")
            self.assertEqual(result.stdout, f"['sub:q{index}'] doc\n")
            self.assertEqual(result.rlm_calls, [f"sub:q{index}"])  # recorded by the branch
        self.assertEqual(env.execute_code("print(seen)").stdout, "[]\n")


class RlmSandboxServerForkTest(ForkChecks, unittest.TestCase):
    """RlmSandbox(server=...).fork: RlmSandbox objects standing for the server's sessions."""

    branch_class = ServerSession

    def make_parent(self, **options: Any) -> RlmSandbox:
        sandbox = RlmSandbox(server=SOCKET, **options)
        self.addCleanup(sandbox.close)
        return sandbox


class PackageTest(unittest.TestCase):
    def test_exports(self) -> None:
        for name in ("Server", "ServerSession", "ServerError", "RunResult"):
            self.assertIn(name, rlm_sandbox.__all__)
