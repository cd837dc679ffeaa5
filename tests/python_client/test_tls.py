"""The Python client through a server's TLS listener (``serve --listen``; docs/fleet.md, "Remote
access"): ``Server("tls://HOST:PORT", tls_cert=, tls_key=, tls_ca=)`` and ``Fleet`` of
``tls://`` endpoints, over the relay of python/rlm_sandbox/_tls_relay.py, which turns the fds a
request hands the server into streams of the connection. Runs (stdin in, stdout and stderr out,
the output cap), sessions (cells, llm_query answered here, add_context, save and load through a
file), node ops and a fleet work as over the unix socket; and every way in is refused that should
be, saying why: no client certificate, one of another CA, an identity without permits, a
loosening request, a server certificate the client's CA did not issue (nothing sent).

One server with a TLS listener for the module (tests/python_client/serve_process.py makes its
certificates with tests/server/make_tls_certs.sh); the node_lost test starts one of its own.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_tls`` from
tests/python_client (ctest's ``python_tls`` test does this).
"""

from __future__ import annotations

import os
import shutil
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import List, Optional
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from rlm_sandbox import (Fleet, RlmSandbox, RlmSandboxError, Server, ServerError,  # noqa: E402
                         read_fleet)
from rlm_sandbox import _tls_relay, _wire  # noqa: E402
from serve_process import BINARY, BOB_UID, RefusedAtOnce, ServeProcess  # noqa: E402

#: Deadlines, generous: the tests share a loaded machine with other suites.
STARTUP_SECONDS = 60.0
AT_ONCE_SECONDS = 10.0

_server: Optional[ServeProcess] = None
#: A directory of the module's own: the policy file of the large-output pool.
_dir = ""
#: The default policy with a 64 MiB output cap, offered as a server-side file: output in both
#: directions at once, far past the sockets' buffers.
LARGE_OUTPUT = 64 << 20
_large_policy = ""


def setUpModule() -> None:  # noqa: N802 - unittest's name
    global _server, _dir, _large_policy
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")
    if not shutil.which("openssl"):
        raise unittest.SkipTest("no openssl to make the test certificates with")
    _dir = tempfile.mkdtemp(prefix="rlm-tls-test-")
    try:
        os.chmod(_dir, 0o755)
        shown = subprocess.run([BINARY, "policy", "show", "default"], stdout=subprocess.PIPE,
                               check=True)
        policy = json.loads(shown.stdout)
        policy["limits"]["output_bytes"] = LARGE_OUTPUT
        _large_policy = os.path.join(_dir, "large-output.json")
        with open(_large_policy, "w") as file:
            json.dump(policy, file)
        _server = ServeProcess(("--pool", "default=1", "--session-pool", "python-repl=1",
                                "--pool", f"{_large_policy}=0", "--allow-uid", str(BOB_UID)),
                               tls=True, client_crl=True, prefix="rlm-tls-",
                               name="the TLS server")
        _server.wait_for_socket(STARTUP_SECONDS)
    except BaseException:
        if _server is not None:
            _server.stop()
        shutil.rmtree(_dir, ignore_errors=True)
        raise


def tearDownModule() -> None:  # noqa: N802
    if _server is not None:
        _server.stop()
    shutil.rmtree(_dir, ignore_errors=True)


def endpoint() -> str:
    assert _server is not None
    return _server.tls_endpoint


def files(who: str = "alice", ca: str = "ca.pem", node: Optional[ServeProcess] = None
          ) -> dict:
    """Server()'s TLS arguments for the certificate `who` ("" for none) and the CA `ca`."""
    node = node or _server
    assert node is not None
    return {"tls_cert": node.tls_file(f"{who}.pem") if who else "",
            "tls_key": node.tls_file(f"{who}.key") if who else "",
            "tls_ca": node.tls_file(ca)}


def tls_server(who: str = "alice", ca: str = "ca.pem") -> Server:
    return Server(endpoint(), connect_timeout=30.0, **files(who, ca))


def unix_server() -> Server:
    assert _server is not None
    return Server(_server.socket, connect_timeout=30.0)


def relay_threads() -> List[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "rlm-tls-relay"]


class TlsTestCase(RefusedAtOnce):
    at_once_seconds = AT_ONCE_SECONDS

    def assert_relays_end(self) -> None:
        """Every relay of the test's connections ends with its connection."""
        deadline = time.monotonic() + 10
        while relay_threads() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(relay_threads(), [])


class RunTest(TlsTestCase):
    def test_a_run_streams_stdin_in_and_output_out_as_over_the_socket(self) -> None:
        # stdin and stdout each several data frames (48 KiB each); numbered lines show order.
        stdin = "".join(f"line {i}\n" for i in range(30000))  # ~260 KB
        script = ("cat; seq 1 40000; echo err >&2; seq 1 3000 >&2; "
                  "head -c 300000 /dev/zero | tr '\\0' a; echo; exit 7")
        over_tls = tls_server().run(["sh", "-c", script], stdin=stdin)
        over_socket = unix_server().run(["sh", "-c", script], stdin=stdin)
        self.assertEqual(over_tls.status, "exit_nonzero", over_tls)
        self.assertEqual(over_tls.exit_code, 7)
        expected_out = (stdin + "".join(f"{i}\n" for i in range(1, 40001)) + "a" * 300000
                        + "\n")
        self.assertEqual(len(over_tls.stdout), len(expected_out))
        self.assertTrue(over_tls.stdout == expected_out, "stdout differs from what was sent")
        self.assertEqual(over_tls.stderr, "err\n" + "".join(f"{i}\n" for i in range(1, 3001)))
        for field in ("status", "exit_code", "stdout", "stderr", "stdout_truncated",
                      "stderr_truncated", "node", "backend", "policy"):
            self.assertEqual(getattr(over_tls, field), getattr(over_socket, field), field)
        self.assertTrue(over_tls.node)
        self.assert_relays_end()

    def test_megabytes_both_ways_at_once(self) -> None:
        # cat's output comes while its input is still being sent: neither side may wait for
        # the other to read first (24 MiB each way, far past the sockets' buffers).
        data = (os.urandom(12 << 20).hex())
        result = tls_server().run(["cat"], stdin=data, policy=_large_policy)
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(len(result.stdout), len(data))
        self.assertTrue(result.stdout == data, "cat's output differs from its input")

    def test_binary_output_and_no_stdin(self) -> None:
        result = tls_server().run(
            code="import sys\nsys.stdout.buffer.write(bytes(range(128)) * 1000)\n"
                 "print(sys.stdin.read() == '', file=sys.stderr)")
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, bytes(range(128)).decode() * 1000)
        self.assertEqual(result.stderr, "True\n")

    def test_output_over_the_cap_ends_output_limit_with_exactly_the_cap(self) -> None:
        server = tls_server()
        cap = server.policy("default")["limits"]["output_bytes"]
        result = server.run(["sh", "-c", f"head -c {cap * 3} /dev/zero | tr '\\0' b; sleep 20"])
        self.assertEqual(result.status, "output_limit", result)
        self.assertTrue(result.stdout_truncated)
        self.assertEqual(len(result.stdout), cap)
        self.assertEqual(result.stdout, "b" * cap)
        self.assertLess(result.wall_ms, 15000, "the cap stopped the run; it did not sleep 20 s")

    def test_a_lower_cap_asked_for_is_kept_to(self) -> None:
        result = tls_server().run(["sh", "-c", "yes 0123456789 | head -c 1000000; sleep 30"],
                                  limits={"output_bytes": 4096})
        self.assertEqual(result.status, "output_limit", result)
        self.assertEqual(len(result.stdout), 4096)
        self.assertLess(result.wall_ms, 20000)

    def test_runs_from_threads_each_on_a_connection_of_its_own(self) -> None:
        server = tls_server()
        results: List[object] = [None] * 6

        def run(index: int) -> None:
            try:
                results[index] = server.run(["sh", "-c", f"cat; echo {index}"],
                                            stdin=f"run {index}\n")
            except BaseException as error:  # noqa: BLE001 - reported below
                results[index] = error

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        for index, result in enumerate(results):
            self.assertEqual(getattr(result, "stdout", result), f"run {index}\n{index}\n")
        self.assert_relays_end()

    def test_no_fd_is_left_open_after_runs(self) -> None:
        server = tls_server()
        server.run(["true"])
        self.assert_relays_end()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            self.assertEqual(server.run(["sh", "-c", "cat"], stdin="x").stdout, "x")
        self.assert_relays_end()
        self.assertEqual(len(os.listdir("/proc/self/fd")), before)

    def test_op_after_op_takes_one_connection(self) -> None:
        # The server says "idle" once an op is over; the relay parks the connection and the
        # next op of this process goes on it: no TCP connect, no handshake.
        server = tls_server()
        server.health()
        with mock.patch.object(_tls_relay, "_connect_tcp",
                               wraps=_tls_relay._connect_tcp) as connects:
            for _ in range(10):
                self.assertTrue(server.health()["alive"])
            for index in range(5):
                self.assertEqual(server.run(["sh", "-c", "cat"], stdin=f"{index}").stdout,
                                 f"{index}")
            with server.session("python-repl") as sb:
                self.assertEqual(sb.execute("print(3)").stdout, "3\n")
            self.assertEqual(server.capacity()["running"], 0)
        # 16 ops: a relay still parking its connection when the next op begins (a loaded machine:
        # the 0.1 s wait for it ran out) costs one more connection now and then, never one each.
        self.assertLessEqual(connects.call_count, 3, "each op made a connection of its own")
        # Another certificate is another connection.
        with mock.patch.object(_tls_relay, "_connect_tcp",
                               wraps=_tls_relay._connect_tcp) as connects:
            self.assertIn("default", tls_server("bob").hello()["policies"])
        self.assertEqual(connects.call_count, 1)
        self.assert_relays_end()

    def test_a_client_that_hangs_up_in_a_run_ends_it(self) -> None:
        # As a unix client closing its socket: the relay says "hangup", the server stops the
        # run, and the connection serves the next op.
        tls = _tls_relay.tls_files(**{key[4:]: value for key, value in files().items()})
        wire = _wire.Wire(_wire.connect(endpoint(), 30.0, tls=tls))
        stdin = os.open(os.devnull, os.O_RDONLY)
        out_read, out_write = os.pipe()
        try:
            wire.send({"op": "run", "policy": "default",
                       "request": {"argv": ["sleep", "60"], "stdin": "null"}},
                      [stdin, out_write, out_write])
            wire.expect("started")
        finally:
            for fd in (stdin, out_write):
                os.close(fd)
        wire.close()
        server = tls_server()
        # Before the policy's wall time (10 s) would have: the hangup, not the limit, ended it.
        deadline = time.monotonic() + 8
        while server.capacity()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(server.capacity()["running"], 0, "the run went on after the hangup")
        self.assertEqual(os.read(out_read, 100), b"", "the run's output pipe was not ended")
        os.close(out_read)
        self.assertTrue(server.health()["alive"])
        self.assert_relays_end()

    def test_a_forked_child_does_not_use_its_parents_connections(self) -> None:
        server = tls_server()
        server.health()  # one parked connection
        child = os.fork()
        if child == 0:  # the child: its own connection, or it would garble the parent's
            code = 1
            try:
                code = 0 if server.run(["echo", "child"]).stdout == "child\n" else 2
            finally:
                os._exit(code)
        self.assertEqual(server.run(["echo", "parent"]).stdout, "parent\n")
        _, status = os.waitpid(child, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertTrue(server.health()["alive"])

    def test_a_reconnect_resumes_the_session(self) -> None:
        tls_server().health()
        tls_server().health()
        context = _tls_relay._contexts[_tls_relay.tls_files(**{
            key[4:]: value for key, value in files().items()})]
        session = context.session_for(endpoint())
        self.assertIsNotNone(session, "no resumption ticket kept for the endpoint")
        self.assertTrue(session.has_ticket)


class GoldenFramesTest(unittest.TestCase):
    """The relay's own frames are the corpus's bytes (tests/golden/server_wire.json), and the
    server's data frames there decode to their bytes."""

    def test_stream_frames_are_the_golden_ones(self) -> None:
        corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden",
                              "server_wire.json")
        with open(corpus, encoding="utf-8") as file:
            valid = json.load(file)["valid"]
        checked = 0
        for entry in valid:
            message = entry["message"]
            wire = b"".join(bytes.fromhex(part["hex"]) if "hex" in part
                            else part["utf8"].encode("utf-8") for part in entry["wire"])
            op = message.get("op")
            with self.subTest(entry["name"]):
                if op == "data":
                    data = bytes.fromhex(entry["stream_bytes_hex"])
                    self.assertEqual(_tls_relay._data_of(message), data)
                    if entry.get("from") == "client":
                        self.assertEqual(_tls_relay._data_frame(message["stream"], data), wire)
                    checked += 1
                elif op == "eof" and entry.get("from") == "client":
                    self.assertEqual(_tls_relay._eof_frame(message["stream"]), wire)
                    checked += 1
                elif op == "hangup":
                    self.assertEqual(_tls_relay._encoded({"op": "hangup"}), wire)
                    checked += 1
        self.assertGreaterEqual(checked, 3, "the corpus has no stream frames")


class SessionTest(TlsTestCase):
    def test_cells_llm_query_add_context_save_and_load(self) -> None:
        prompts: List[str] = []

        def answer(prompt, model) -> str:
            prompts.append(prompt)
            return f"echo: {prompt}"

        big_context = "the context, streamed\n" + "c" * 200000
        with tls_server().session("python-repl", context=big_context,
                                  on_llm_query=answer) as sb:
            self.assertTrue(sb.node)
            self.assertTrue(sb.session_id.startswith(sb.node + "/"), sb.session_id)
            cell = sb.execute("print(context.splitlines()[0], len(context))\n"
                              "print(llm_query('over TLS'))\nx = 41")
            self.assertEqual(cell.status, "ok", cell.error)
            self.assertEqual(cell.stdout, f"the context, streamed {len(big_context)}\n"
                                          "echo: over TLS\n")
            self.assertEqual(prompts, ["over TLS"])
            self.assertEqual(sb.add_context("more"), 1)
            self.assertEqual(sb.execute("print(context_1)").stdout, "more\n")
            self.assertEqual(sb.add_context({"k": [1, 2]}), 2)
            self.assertEqual(sb.execute("print(context_2['k'])").stdout, "[1, 2]\n")
            # A cell result larger than a stream frame is passed on whole.
            big = sb.execute("print('y' * 3000000)")
            self.assertEqual(big.status, "ok", big.error)
            self.assertEqual(big.stdout, "y" * 3000000 + "\n")

            directory = tempfile.mkdtemp(prefix="rlm-tls-save-")
            self.addCleanup(shutil.rmtree, directory, True)
            path = os.path.join(directory, "state.save")
            saved = sb.save(path)
            self.assertEqual(saved.status, "ok", saved.error)
            self.assertEqual(os.path.getsize(path), saved.saved["bytes"],
                             "the save file arrived whole before the answer")
            self.assertEqual(sb.execute("x = 0").status, "ok")
            self.assertEqual(sb.load(path).status, "ok")
            self.assertEqual(sb.execute("print(x + 1)").stdout, "42\n")
            closed = sb.close()
        self.assertEqual(closed["status"], "ok", closed)
        self.assert_relays_end()

    def test_a_saved_state_restores_into_a_new_session_over_tls(self) -> None:
        directory = tempfile.mkdtemp(prefix="rlm-tls-save-")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "state.save")
        server = tls_server()
        with server.session("python-repl") as sb:
            sb.execute("data = list(range(5))")
            self.assertEqual(sb.save(path).status, "ok")
        with server.restore_session(path) as restored:
            self.assertEqual(restored.execute("print(sum(data))").stdout, "10\n")
        # And the same file over the unix socket: the bytes are the server's own either way.
        with unix_server().restore_session(path) as restored:
            self.assertEqual(restored.execute("print(data[-1])").stdout, "4\n")

    def test_fork_over_tls(self) -> None:
        with tls_server().session("python-repl") as sb:
            sb.execute("n = 10")
            branches = sb.fork(2)
            try:
                for index, branch in enumerate(branches):
                    self.assertEqual(branch.server.path, endpoint())
                    branch.execute(f"n += {index}")
                self.assertEqual([b.execute("print(n)").stdout for b in branches],
                                 ["10\n", "11\n"])
                self.assertEqual(sb.execute("print(n)").stdout, "10\n")
            finally:
                for branch in branches:
                    branch.close()


class NodeTest(TlsTestCase):
    def test_node_ops_over_tls(self) -> None:
        server, local = tls_server(), unix_server()
        health = server.health()
        self.assertTrue(health["alive"])
        self.assertEqual(health["pid"], local.health()["pid"])
        self.assertEqual(health["node"], local.health()["node"])
        capacity = server.capacity()
        for key in ("node_id", "version", "features", "max_sandboxes", "running", "warm_idle"):
            self.assertIn(key, capacity)
        self.assertEqual(capacity["node_id"], health["node"])
        self.assertIn("ready", server.ready())
        self.assertIn("default", server.hello()["policies"])

    def test_the_environment_names_the_files(self) -> None:
        names = {"RLM_SANDBOX_TLS_CERT": "alice.pem", "RLM_SANDBOX_TLS_KEY": "alice.key",
                 "RLM_SANDBOX_TLS_CA": "ca.pem", "RLM_SANDBOX_SERVER": None}
        saved = {name: os.environ.get(name) for name in names}
        try:
            for name, file in names.items():
                if file:
                    os.environ[name] = _server.tls_file(file)
            os.environ["RLM_SANDBOX_SERVER"] = endpoint()
            self.assertTrue(Server().health()["alive"])
            with RlmSandbox(timeout=60) as sb:  # the server from the environment, over TLS
                self.assertEqual(sb.execute("print(1 + 1)").stdout, "2\n")
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class FleetTest(TlsTestCase):
    def test_a_fleet_of_one_tls_endpoint(self) -> None:
        fleet = Fleet([endpoint()], **files())
        result = fleet.run(["sh", "-c", "cat; echo placed"], stdin="in\n")
        self.assertEqual(result.status, "ok", result)
        self.assertEqual(result.stdout, "in\nplaced\n")
        self.assertEqual(result.node, unix_server().health()["node"])
        [status] = fleet.status()
        self.assertEqual(status["endpoint"], endpoint())
        self.assertNotIn("error", status)
        self.assertEqual(status["node_id"], result.node)
        with fleet.session("python-repl") as sb:
            self.assertEqual(sb.execute("print(6 * 7)").stdout, "42\n")
        self.assertIn("limits", fleet.policy("default"))

    def test_a_fleet_file_names_tls_endpoints(self) -> None:
        directory = tempfile.mkdtemp(prefix="rlm-tls-fleet-")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "fleet")
        with open(path, "w") as file:
            file.write(f"# the TLS node\n{endpoint()}\ntls://[::1]:7443\n")
        self.assertEqual(read_fleet(path), [endpoint(), "tls://[::1]:7443"])
        with open(path, "w") as file:
            file.write(f"{endpoint()}\n")
        self.assertEqual(Fleet(path, **files()).run(["echo", "hi"]).stdout, "hi\n")
        for bad in ("tls://10.0.0.1", "tls://:7000", "tls://::1:7000", "tls://h:0",
                    "tls://h:70000", "tls://h:port"):
            with self.subTest(endpoint=bad):
                with self.assertRaises(ValueError) as caught:
                    Fleet([bad])
                self.assertIn("tls://HOST:PORT", str(caught.exception))

    def test_a_node_that_refuses_the_certificate_is_passed_over_saying_why(self) -> None:
        fleet = Fleet([endpoint()], **files(""))
        error = self.refused("resource_exhausted", lambda: fleet.run(["true"]))
        self.assertIn("requires a client certificate", str(error))
        [status] = fleet.status()
        self.assertIn("requires a client certificate", status["error"])


class RefusalTest(TlsTestCase):
    def test_no_client_certificate(self) -> None:
        for request in (lambda server: server.hello(), lambda server: server.run(["true"])):
            error = self.refused("unavailable", lambda: request(tls_server("")))
            self.assertIn("requires a client certificate", str(error))
            self.assertIn(endpoint(), str(error))
        self.assert_relays_end()

    def test_a_certificate_of_another_ca_though_its_name_is_allowed(self) -> None:
        # stranger.pem says CN=alice, but another CA issued it.
        error = self.refused("unavailable", lambda: tls_server("stranger").run(["true"]))
        self.assertIn("does not accept this client certificate", str(error))

    def test_a_revoked_certificate(self) -> None:
        # The server checks its --client-crl, which lists "revoked" (and not alice or bob, whom
        # every other test of this module connects as).
        error = self.refused("unavailable", lambda: tls_server("revoked").run(["true"]))
        self.assertIn("has revoked this client certificate", str(error))

    def test_an_identity_without_permits(self) -> None:
        error = self.refused("refused", lambda: tls_server("nobody").hello())
        self.assertIn("'nobody'", str(error))
        self.assertIn("no permits", str(error))
        error = self.refused("refused", lambda: tls_server("nobody").session("python-repl"))
        self.assertIn("no permits", str(error))

    def test_a_loosening_request_is_refused_as_on_the_socket(self) -> None:
        server = tls_server()
        memory = server.policy("default")["limits"]["memory_bytes"]
        error = self.refused("refused", lambda: server.run(
            ["true"], limits={"memory_bytes": memory * 64}))
        self.assertIn("limits.memory_bytes", [path for path, _ in error.diagnostics])
        error = self.refused("refused", lambda: server.session("python-repl",
                                                               memory=memory * 64))

    def test_a_server_the_clients_ca_did_not_issue_is_sent_nothing(self) -> None:
        # Refused in the handshake, before the connection exists: no frame could be sent.
        tls = _tls_relay.tls_files(**{key[4:]: value for key, value in
                                      files("alice", "other-ca.pem").items()})
        began = time.monotonic()
        with self.assertRaises(ServerError) as caught:
            _wire.connect(endpoint(), 30.0, tls=tls)
        self.assertLess(time.monotonic() - began, AT_ONCE_SECONDS)
        self.assertEqual(caught.exception.kind, "unavailable")
        self.assertIn("does not verify", str(caught.exception))
        self.assertEqual(relay_threads(), [])
        error = self.refused("unavailable", lambda: tls_server("alice", "other-ca.pem").run(
            ["true"]))
        self.assertIn("does not verify", str(error))

    def test_files_that_cannot_be_used(self) -> None:
        missing = os.path.join(_server.dir, "tls", "missing.pem")
        for arguments, words in (
                ({**files(), "tls_ca": missing}, "missing.pem"),
                ({**files(), "tls_ca": ""}, "a CA file is needed"),
                ({**files(), "tls_key": ""}, "needs its key too"),
                ({**files(), "tls_key": _server.tls_file("bob.key")}, "alice.pem")):
            with self.subTest(arguments=arguments):
                error = self.refused("unavailable", lambda: Server(endpoint(), **arguments)
                                     .health())
                self.assertIn("TLS client files", str(error))
                self.assertIn(words, str(error))

    def test_a_plain_unix_client_is_not_sent_to_tls(self) -> None:
        # A unix path is still a unix path, whatever TLS files are given.
        self.assertTrue(Server(_server.socket, **files()).health()["alive"])
        with self.assertRaises(RlmSandboxError):
            Server("tls://127.0.0.1:1", **files()).health()  # nothing listens there


class NodeLostTest(TlsTestCase):
    """A session whose TLS server is killed (no close_notify: the TCP connection just ends)
    is node_lost, as over the unix socket, not a refusal a fleet would place elsewhere."""

    def test_a_killed_server_is_node_lost(self) -> None:
        node = ServeProcess(("--pool", "default=1", "--session-pool", "python-repl=0"),
                            tls=True, prefix="rlm-tls-lost-", name="the TLS server to kill")
        self.addCleanup(node.stop)
        node.wait_for_socket(STARTUP_SECONDS)
        server = Server(node.tls_endpoint, **files(node=node))
        sb = server.session("python-repl")
        self.assertEqual(sb.execute("x = 1").status, "ok")

        box = {}

        def run() -> None:
            try:
                box["result"] = server.run(["sleep", "30"])
            except BaseException as error:  # noqa: BLE001 - checked below
                box["error"] = error

        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(2.0)  # the run has started
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        # A killed server leaves its sandboxes' cgroups for the next runtime process to collect
        # (docs/cgroups.md): one direct run does, so the test leaves nothing behind.
        self.addCleanup(subprocess.run, [BINARY, "run", "-q", "--", "/bin/true"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        runner.join(30)
        self.assertFalse(runner.is_alive())
        self.assertIsInstance(box.get("error"), ServerError, box)
        self.assertEqual(box["error"].kind, "node_lost", str(box["error"]))
        with self.assertRaises(ServerError) as caught:
            sb.execute("print(x)")
        self.assertEqual(caught.exception.kind, "node_lost", str(caught.exception))
        self.assertEqual(sb.close()["status"], "sandbox_error")
        # A connection parked before the kill is not taken for a server that is gone.
        self.refused("unavailable", server.health)
        self.assert_relays_end()


if __name__ == "__main__":
    unittest.main()
