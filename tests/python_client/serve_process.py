"""One ``rlm-sandbox serve`` of a test's own, for the tests that start servers of their own
(test_node_contract, test_fleet, test_tls): its directory, socket, process and log, waiting for
it to listen, its exit status, and stopping it (SIGINT, then SIGKILL) with its directory removed;
optionally a TLS listener beside the socket, with certificates of its own; and RefusedAtOnce,
the assertion they make of a server's refusals.

Not a test module: imported by the tests beside it (ctest runs them from this directory, and a
test file run as a script has its own directory on ``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Callable, Optional, Sequence

_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
if _PACKAGE not in sys.path:
    sys.path.insert(0, _PACKAGE)
from rlm_sandbox import Server, ServerError  # noqa: E402

BINARY = os.environ.get("RLM_SANDBOX_BIN") or shutil.which("rlm-sandbox")
#: Makes a TLS listener's certificates (ca, other-ca, node, alice, bob, nobody, stranger).
MAKE_TLS_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server",
                              "make_tls_certs.sh")
#: The uid the certificate "bob" stands for (alice: this process's own).
BOB_UID = 65534

#: How long exit_code() waits by default (generous: the tests share a loaded machine).
EXIT_SECONDS = 60.0


class ServeProcess:
    """``rlm-sandbox serve --socket DIR/SOCKET_NAME *args`` (then ``--node-id``, ``--register``
    when given) in a fresh directory ``prefix*``; stderr is kept in DIR/serve.log so a chatty
    server never blocks on a pipe. ``name`` is how messages call the server.

    With ``tls=True``, a TLS listener too, as the C++ tests' ServerProcess makes one:
    certificates made fresh in DIR/tls by tests/server/make_tls_certs.sh (:meth:`tls_file`),
    ``--listen 127.0.0.1:0`` with the node's certificate, ``--client-ca ca.pem`` and the
    identities alice (this process's uid) and bob (BOB_UID), and with ``client_crl`` the CA's
    revocation list (``--client-crl``, revoking "revoked"); :meth:`wait_for_socket` then waits
    for the listener's address too (:attr:`tls_endpoint`, ``"tls://127.0.0.1:PORT"``)."""

    def __init__(self, args: Sequence[str] = (), *, node_id: Optional[str] = None,
                 register: Optional[str] = None, prefix: str = "rlm-serve-",
                 socket_name: str = "s.sock", name: str = "the server",
                 tls: bool = False, client_crl: bool = False) -> None:
        self.node_id = node_id
        self.registry = register
        self.name = name
        self.tls = tls
        #: With ``tls``: ``"tls://127.0.0.1:PORT"`` once wait_for_socket returned.
        self.tls_endpoint = ""
        self.dir = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.dir, 0o755)
        self.socket = os.path.join(self.dir, socket_name)
        self.log_path = os.path.join(self.dir, "serve.log")
        command = [BINARY, "serve", "--socket", self.socket, *args]
        if node_id is not None:
            command += ["--node-id", node_id]
        if register is not None:
            command += ["--register", register]
        if tls:
            made = subprocess.run(["/bin/sh", MAKE_TLS_CERTS, os.path.join(self.dir, "tls")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, check=False)
            if made.returncode != 0:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise RuntimeError("make_tls_certs.sh failed: "
                                   + made.stdout.decode(errors="replace"))
            command += ["--listen", "127.0.0.1:0", "--tls-cert", self.tls_file("node.pem"),
                        "--tls-key", self.tls_file("node.key"),
                        "--client-ca", self.tls_file("ca.pem"),
                        "--tls-identity", f"alice={os.getuid()}",
                        "--tls-identity", f"bob={BOB_UID}"]
            if client_crl:  # the CA's list, revoking the certificate "revoked"
                command += ["--client-crl", self.tls_file("crl.pem")]
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.server = Server(self.socket, connect_timeout=30.0)

    def tls_file(self, name: str) -> str:
        """A file make_tls_certs.sh made for this server: ``ca.pem``, ``other-ca.pem``,
        ``alice.pem``/``alice.key``, ``bob``, ``nobody``, ``stranger`` (CN alice, by
        other-ca)."""
        return os.path.join(self.dir, "tls", name)

    @property
    def endpoint_file(self) -> str:
        """The file ``--register`` writes for this node (needs both register and node_id)."""
        assert self.registry is not None and self.node_id is not None
        return os.path.join(self.registry, f"{self.node_id}.endpoint")

    def raise_if_exited(self, what: str = "rlm-sandbox serve") -> None:
        """RuntimeError naming the exit status and the log if the server has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {self.proc.returncode}: {self.log()}")

    def wait_for_socket(self, seconds: float) -> None:
        """Returns once the socket accepts a connection (and, with ``tls``, the server's
        "listening" line named its TLS address); RuntimeError if the server exits or does not
        listen within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.raise_if_exited()
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.socket)
                break
            except OSError:
                time.sleep(0.05)
            finally:
                probe.close()
        else:
            raise RuntimeError(f"rlm-sandbox serve did not listen on {self.socket} within "
                               f"{seconds} s")
        key = '"tls":"'
        while self.tls and not self.tls_endpoint:
            try:
                with open(self.log_path, "rb") as log:  # the line is among the first
                    text = log.read(1 << 16).decode(errors="replace")
            except OSError:
                text = ""
            at = text.find(key)
            end = text.find('"', at + len(key)) if at >= 0 else -1
            if end >= 0:
                self.tls_endpoint = "tls://" + text[at + len(key):end]
            elif time.monotonic() > deadline:
                raise RuntimeError(f"rlm-sandbox serve did not say its TLS address: "
                                   f"{self.log()}")
            else:
                self.raise_if_exited()
                time.sleep(0.02)

    def log(self) -> str:
        """The last 4000 characters of the server's stderr."""
        try:
            with open(self.log_path, "rb") as log:
                return log.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def exit_code(self, seconds: float = EXIT_SECONDS) -> int:
        """The server's exit status, once it exits (within `seconds`, else the test fails)."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {seconds} s; its log: "
                                 f"{self.log()}") from None

    def kill_hard(self) -> None:
        """SIGKILL, and reap it."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGINT (stops at once), then SIGKILL if it lingers; removes the directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill_hard()
        shutil.rmtree(self.dir, ignore_errors=True)


class RefusedAtOnce(unittest.TestCase):
    """A test case whose `refused` asserts a request is refused at once: within
    `at_once_seconds` (each test module sets its own)."""

    at_once_seconds: float = 5.0

    def refused(self, kind: str, request: Callable[[], Any]) -> ServerError:
        """`request()` raises ServerError of `kind`, at once."""
        began = time.monotonic()
        with self.assertRaises(ServerError) as caught:
            request()
        elapsed = time.monotonic() - began
        self.assertEqual(caught.exception.kind, kind, str(caught.exception))
        self.assertLess(elapsed, self.at_once_seconds,
                        f"refused {kind} only after {elapsed:.1f} s")
        return caught.exception
