"""The framing of ``rlm-sandbox serve`` (docs/pools-and-server.md, "The protocol"): a 4-byte
big-endian length, then one UTF-8 JSON object; file descriptors ride as SCM_RIGHTS on the
frame's first bytes."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from .result import RlmSandboxError

if TYPE_CHECKING:
    from ._tls_relay import TlsFiles

#: The largest frame this client sends (the server refuses more) and takes from the server (a
#: cell result carries a cell's output, capped by the policy).
MAX_FRAME_BYTES = 64 << 20
_MAX_REPLY_BYTES = 256 << 20
_MAX_FDS = 4


def _refuse_constant(name: str) -> Any:
    """json.loads takes NaN, Infinity and -Infinity by default; they are not JSON (the server
    never sends them), and a count that is one would poison arithmetic on it."""
    raise ValueError(f"{name} is not JSON")


def decode_json(text: str) -> Any:
    """`text` as JSON, strictly: NaN, Infinity and -Infinity are refused (ValueError)."""
    return json.loads(text, parse_constant=_refuse_constant)


class ServerError(RlmSandboxError):
    """The server refused or failed a request: ``kind`` is ``refused``, ``invalid``,
    ``unavailable``, ``internal``, ``resource_exhausted`` (the node holds its
    ``--max-sandboxes`` runs and sessions: try another node, or again once one ends),
    ``draining`` (the node takes no new work), ``node_drained`` (a drain's grace ended the
    session) or ``node_lost`` (the connection of a session, or of a run under way, ended with
    no answer: its node is gone, and so is what it held); ``diagnostics`` lists
    ``(path, message)`` for each way a refused policy loosens the offered one."""

    def __init__(self, kind: str, message: str, diagnostics: Sequence[Dict[str, str]] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.diagnostics = [(str(d.get("path", "")), str(d.get("message", "")))
                            for d in diagnostics if isinstance(d, dict)]


class ConnectionLost(ServerError):
    """The connection ended with no answer from the server (end of file, a broken pipe, a
    reset): kind ``unavailable``. A session turns it into ``node_lost``."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


def server_uid_from_environment() -> Optional[int]:
    """The uid named by ``$RLM_SANDBOX_SERVER_UID``, or None; ValueError when it is not one."""
    value = os.environ.get("RLM_SANDBOX_SERVER_UID")
    if not value:
        return None
    if not value.isdigit() or int(value) >= 0xFFFFFFFF:
        raise ValueError(f"RLM_SANDBOX_SERVER_UID {value!r}: not a uid (a number, e.g. 0 or 1000)")
    return int(value)


def _check_listener(sock: socket.socket, path: str, server_uid: Optional[int]) -> None:
    """Whoever bound the path first listens there and would receive the payload's stdio fds, and
    could forge its output: only root, this process's uid or `server_uid` (default
    ``$RLM_SANDBOX_SERVER_UID``) is sent anything."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    uid &= 0xFFFFFFFF
    if server_uid is None:
        server_uid = server_uid_from_environment()
    if uid in (0, os.geteuid(), os.getuid()) or uid == server_uid:
        return
    raise ServerError("unavailable",
                      f"the process listening at {path} runs as uid {uid}, not root or you; "
                      f"refusing to send it anything (set RLM_SANDBOX_SERVER_UID={uid} if it "
                      f"is yours)")


def connect(path: str, timeout: Optional[float], server_uid: Optional[int] = None,
            tls: Optional["TlsFiles"] = None) -> socket.socket:
    """A connection to the server at `path`; ServerError(``unavailable``) when none answers, or
    when the listener runs as a uid other than root, this process's or `server_uid`.

    A `path` of ``tls://HOST:PORT`` is the server's TLS listener, reached with `tls` (default:
    ``$RLM_SANDBOX_TLS_CERT``, ``_KEY``, ``_CA``): the connection is then one end of a
    socketpair whose other end a relay thread serves (_tls_relay.py), used as a unix one is; the
    server's certificate, not its uid, is what is checked."""
    if isinstance(path, str) and path.startswith("tls://"):
        from ._tls_relay import connect_tls, tls_files  # noqa: PLC0415 - it imports this module
        return connect_tls(path, tls if tls is not None else tls_files(), timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(os.fspath(path))
    except OSError as error:
        sock.close()
        raise ServerError("unavailable", f"no rlm-sandbox server at {path}: {error.strerror or error}"
                          ) from error
    try:
        _check_listener(sock, os.fspath(path), server_uid)
    except BaseException:
        sock.close()
        raise
    return sock


class Wire:
    """One connection: whole frames out (one writer at a time), whole frames in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, frame: Dict[str, Any], fds: Sequence[int] = ()) -> None:
        body = json.dumps(frame, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
        if len(body) > MAX_FRAME_BYTES:
            raise ValueError(f"the frame is {len(body)} bytes; the server takes at most "
                             f"{MAX_FRAME_BYTES}")
        data = struct.pack(">I", len(body)) + body
        with self._send_lock:
            try:
                sent = socket.send_fds(self.sock, [data], list(fds)) if fds else 0
                if sent < len(data):
                    self.sock.sendall(data[sent:])
            except OSError as error:
                # A server that refused an earlier frame said why before it closed: that reason,
                # not the broken pipe, is what the caller needs.
                reason = self._pending_error()
                if reason is not None:
                    raise reason from error
                raise ConnectionLost(f"the server connection broke: {error}") from error

    def _pending_error(self) -> Optional[ServerError]:
        previous = self.sock.gettimeout()
        try:
            # 0.5 s for the whole frame, not per read: a peer trickling bytes is cut off.
            frame = self.receive(deadline=time.monotonic() + 0.5)
        except RlmSandboxError:
            return None
        finally:
            try:
                self.sock.settimeout(previous)
            except OSError:
                pass
        try:
            raise_if_error(frame)
        except ServerError as error:
            return error
        return None

    def _read_exactly(self, size: int, deadline: Optional[float] = None) -> bytes:
        chunks = []
        while size:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("the deadline passed")
                self.sock.settimeout(remaining)
            # recv_fds, so an fd the server should never send is closed, not leaked.
            data, fds, _, _ = socket.recv_fds(self.sock, min(size, 1 << 20), _MAX_FDS)
            for fd in fds:
                os.close(fd)
            if not data:
                raise ConnectionLost("the server closed the connection")
            chunks.append(data)
            size -= len(data)
        return b"".join(chunks)

    def receive(self, deadline: Optional[float] = None,
                max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """The next frame. An ``error`` frame is returned like any other.

        `deadline` (a ``time.monotonic()`` value) bounds the whole frame, not each read: a
        server that trickles its answer is cut off there (ServerError ``unavailable``).
        `max_bytes` caps the frame's body below the default cap (ServerError ``internal``)."""
        limit = _MAX_REPLY_BYTES if max_bytes is None else min(max_bytes, _MAX_REPLY_BYTES)
        try:
            (size,) = struct.unpack(">I", self._read_exactly(4, deadline))
            if size > limit:
                raise ServerError("internal", f"the server sent a frame of {size} bytes"
                                  + (f" (at most {limit} taken here)" if max_bytes is not None
                                     else ""))
            frame = decode_json(self._read_exactly(size, deadline).decode("utf-8"))
        except socket.timeout as error:
            raise ServerError("unavailable", "the server did not answer in time") from error
        except OSError as error:
            raise ConnectionLost(f"the server connection broke: {error}") from error
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
            raise ServerError("internal", f"the server sent a malformed frame: {error}") from error
        if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
            raise ServerError("internal", "the server sent a frame without an \"op\"")
        return frame

    def expect(self, *ops: str, deadline: Optional[float] = None,
               max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """The next frame, which must be one of `ops`; an error frame raises ServerError.
        `deadline` and `max_bytes` as for :meth:`receive`."""
        frame = self.receive(deadline, max_bytes)
        raise_if_error(frame)
        if frame["op"] not in ops:
            raise ServerError("internal", f"the server answered {frame['op']!r} where "
                              f"{' or '.join(ops)} was due")
        return frame

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def raise_if_error(frame: Dict[str, Any]) -> None:
    if frame.get("op") != "error":
        return
    message = str(frame.get("message") or "the server refused the request")
    raise ServerError(str(frame.get("kind") or "internal"), message,
                      frame.get("diagnostics") or ())
