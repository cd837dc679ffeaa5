"""The client's side of a server's TLS listener (``tls://HOST:PORT``; docs/fleet.md, "The wire
over TLS"), as the C++ client's ``runtime/server/tls_relay.cpp`` does it.

The client's code gets one end of a socketpair and speaks the unix protocol on it exactly as it
does on the server's unix socket, fds passed with SCM_RIGHTS and all. A relay thread owns the
other end and the TLS connection, and translates: a frame that carries fds gets ``"streams"``
(one ``{"id": N, "kind": K}`` per fd, in the fds' order) and goes over TLS without them; the
bytes of an ``in`` fd (stdin, a context) follow as ``{"op":"data","stream":N,"data":BASE64}``
frames and ``{"op":"eof","stream":N}``, a ``file_in`` fd (load's file) is sent whole right after
its frame, and what the server sends on an ``out`` or ``file_out`` stream is written into its fd.
Every other frame of the server's goes to the client's code unchanged, but ``{"op":"idle"}``:
the op is over, so the client's code sees its end of file (as the unix socket's ops end theirs)
and the connection is kept for this process's next op (_IdleConnections). A client's code that
hangs up in an op has the relay send ``{"op":"hangup"}``, and the server ends the op as it does
for a unix client that closes its socket.

TLS 1.3 only; the server's certificate must chain to the CA given and name the host dialled (an
IP address SAN for an address). With TLS 1.3 a server that rejects the client's certificate says
so only after the handshake, at the first read: the relay then sends the client's code an error
frame (``unavailable``, "TLS connection to ENDPOINT: WHY") and closes.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import ssl
import struct
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._wire import ServerError, decode_json

#: A data frame carries at most this many bytes (64 KiB once in base64).
STREAM_CHUNK = 48 << 10
#: No data or eof frame is longer than this; a longer frame of the server's (a result, a cell
#: result, an LM call) is passed on as its bytes come, never held whole.
_MAX_STREAM_FRAME = 80 << 10
#: The largest frame taken from either side (the C++ client's kMaxServerFrame).
_MAX_FRAME = 1 << 30
#: A frame once begun must be sent (or read) within this (the C++ client's kServerFrameTimeout).
_FRAME_SECONDS = 60.0
#: The handshake's deadline when the caller gives none.
_CONNECT_SECONDS = 10.0
_MAX_FDS = 16
_MAX_ENDPOINTS = 4096  # a fleet's nodes; beyond, no resumption ticket is kept

#: The kinds of the fds a frame carries, by its op (remote_wire.cpp's stream_kinds_of).
_STREAM_KINDS: Dict[str, Tuple[str, ...]] = {
    "run": ("in", "out", "out"),
    "session_open": ("in",),
    "add_context": ("in",),
    "save": ("file_out",),
    "load": ("file_in",),
}

_ENVIRONMENT = ("RLM_SANDBOX_TLS_CERT", "RLM_SANDBOX_TLS_KEY", "RLM_SANDBOX_TLS_CA")


class TlsFiles(NamedTuple):
    """A client's certificate and key (both or neither) and the CA the server's certificate must
    chain to; empty strings for none."""

    cert: str = ""
    key: str = ""
    ca: str = ""


def tls_files(cert: Optional[os.PathLike] = None, key: Optional[os.PathLike] = None,
              ca: Optional[os.PathLike] = None) -> TlsFiles:
    """The files given, each one not given from ``$RLM_SANDBOX_TLS_CERT``, ``_KEY``, ``_CA``."""
    given = (cert, key, ca)
    return TlsFiles(*(os.fsdecode(os.fspath(value)) if value is not None
                      else os.environ.get(name, "") for value, name in zip(given, _ENVIRONMENT)))


def is_tls_endpoint(endpoint: str) -> bool:
    return endpoint.startswith("tls://")


def split_endpoint(endpoint: str) -> Tuple[str, str]:
    """(host, port) of ``tls://HOST:PORT`` or ``tls://[V6]:PORT``; ValueError for anything else
    (as runtime/server/tls.cpp's split_host_port takes them)."""
    if not is_tls_endpoint(endpoint):
        raise ValueError(f"'{endpoint}' is not tls://HOST:PORT")
    text = endpoint[6:]
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or close + 1 >= len(text) or text[close + 1] != ":":
            raise ValueError(f"'{endpoint}' is not tls://HOST:PORT")
        host, port = text[1:close], text[close + 2:]
    else:
        host, _, port = text.rpartition(":")
        if ":" in host:  # a v6 address unbracketed
            raise ValueError(f"'{endpoint}' is not tls://HOST:PORT ([V6]:PORT for an IPv6 "
                             f"address)")
    if not host or "\0" in host or not port or len(port) > 5 or \
            not all("0" <= c <= "9" for c in port) or not 0 < int(port) <= 65535:
        raise ValueError(f"'{endpoint}' is not tls://HOST:PORT")
    return host, port


# -- what a failure means, in words a user can act on (tls.cpp's explain) ------------------------

def _reasons(error: BaseException) -> str:
    """OpenSSL's reason for `error`, as the C++ client words it ("tlsv13 alert certificate
    required"), with the verification's own for a certificate that did not verify."""
    if isinstance(error, ssl.SSLError):
        reason = getattr(error, "reason", None)
        text = reason.lower().replace("_", " ") if reason else (
            str(error.args[1]) if len(error.args) > 1 else str(error))
        verify = getattr(error, "verify_message", None)
        if verify:
            text += f" ({verify})"
        return text
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error) or type(error).__name__


def explain(reasons: str) -> str:
    """What a failed handshake or read means: the alerts a server sends when it rejects our
    certificate or we presented none, a peer that does not speak TLS (1.3), a server whose
    certificate our CA did not issue."""
    low = reasons.lower()
    if "certificate required" in low:
        return ("the server requires a client certificate (tls_cert= and tls_key=, or "
                "RLM_SANDBOX_TLS_CERT and RLM_SANDBOX_TLS_KEY): " + reasons)
    if "certificate revoked" in low:
        return "the server has revoked this client certificate (its --client-crl): " + reasons
    if "unknown ca" in low or "bad certificate" in low or "decrypt error" in low:
        return ("the server does not accept this client certificate (not issued by its "
                "--client-ca, or its --client-crl has no current list for that CA): " + reasons)
    if "wrong version number" in low or "http request" in low or "packet length too long" in low:
        return "the peer does not speak TLS: " + reasons
    if "certificate verify failed" in low:
        return "the peer's certificate does not verify against the CA given: " + reasons
    if "unsupported protocol" in low or "protocol version" in low:
        return "the peer does not speak TLS 1.3: " + reasons
    return reasons


class _Broken(Exception):
    """The connection is over; the message says why (sent to the client's code)."""


# -- contexts, one per set of files, each keeping a resumption ticket per endpoint ---------------

class _Context:
    def __init__(self, files: TlsFiles) -> None:
        if bool(files.cert) != bool(files.key):
            raise ValueError("a TLS client certificate needs its key too (tls_cert= with "
                             "tls_key=)")
        if not files.ca:
            raise ValueError("a CA file is needed to check the server's certificate")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.maximum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        for what, path, load in (
                ("CA", files.ca, lambda: context.load_verify_locations(cafile=files.ca)),
                ("certificate", files.cert,
                 lambda: files.cert and context.load_cert_chain(files.cert, files.key))):
            try:
                load()
            except (OSError, ssl.SSLError) as error:
                raise ValueError(f"TLS {what} {path}: {_reasons(error)}") from None
        self.ssl = context
        self._sessions: Dict[str, ssl.SSLSession] = {}
        self._lock = threading.Lock()

    def session_for(self, endpoint: str) -> Optional[ssl.SSLSession]:
        with self._lock:
            return self._sessions.get(endpoint)

    def remember(self, endpoint: str, session: ssl.SSLSession) -> None:
        with self._lock:
            if endpoint in self._sessions or len(self._sessions) < _MAX_ENDPOINTS:
                self._sessions[endpoint] = session


_contexts: Dict[TlsFiles, _Context] = {}
_contexts_lock = threading.Lock()


def _context_for(files: TlsFiles) -> _Context:
    """The context of `files`, made once per process (loading them costs more than a run)."""
    with _contexts_lock:
        context = _contexts.get(files)
        if context is None:
            try:
                context = _Context(files)
            except ValueError as error:
                raise ServerError("unavailable",
                                  f"TLS client files: {error} (tls_cert=, tls_key=, tls_ca= or "
                                  f"RLM_SANDBOX_TLS_CERT, _KEY, _CA)") from None
            _contexts[files] = context
        return context


# -- the connection ------------------------------------------------------------------------------

def _connect_tcp(host: str, port: str, deadline: float) -> socket.socket:
    name = f"{host}:{port}"
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICSERV)
    except socket.gaierror as error:
        raise ServerError("unavailable", f"cannot resolve {name}: {error.strerror or error}"
                          ) from None
    why = "no address"
    for family, kind, proto, _, address in found:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            why = "no connection within the deadline"
            break
        sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
        sock.settimeout(remaining)
        try:
            sock.connect(address)
        except socket.timeout:
            why = "no connection within the deadline"
        except OSError as error:
            why = error.strerror or str(error)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        sock.close()
    raise ServerError("unavailable", f"cannot connect to {name}: {why}")


def _handshake(sock: socket.socket, tls: ssl.SSLObject, outgoing: ssl.MemoryBIO,
               incoming: ssl.MemoryBIO, endpoint: str, deadline: float) -> None:
    """The client's handshake by `deadline`; ServerError ``unavailable`` saying why not."""
    def refused(why: str) -> ServerError:
        return ServerError("unavailable", f"TLS handshake with {endpoint}: {why}")

    def flush() -> None:
        data = outgoing.read()
        if data:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(data)

    while True:
        try:
            try:
                tls.do_handshake()
                flush()
                return
            except ssl.SSLWantReadError:
                flush()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout() from None
                sock.settimeout(remaining)
                data = sock.recv(1 << 16)
                if data:
                    incoming.write(data)
                else:
                    incoming.write_eof()
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError,
                BrokenPipeError):
            raise refused("the server closed the connection (is it a TLS listener?)") from None
        except ssl.SSLError as error:
            raise refused(explain(_reasons(error))) from None
        except socket.timeout:
            raise refused("no handshake within the deadline") from None
        except OSError as error:
            raise refused(_reasons(error)) from None


def connect_tls(endpoint: str, files: TlsFiles, timeout: Optional[float]) -> socket.socket:
    """A connection to the TLS listener at `endpoint` (``tls://HOST:PORT``) with `files`: the
    client's code's end of a socketpair (its timeout `timeout`), which it uses as it would a
    connection to the server's unix socket; a relay thread serves the other end until either
    side ends. ServerError ``unavailable`` when the files cannot be used, no server answers or
    the handshake fails (a server certificate the CA did not issue: nothing is sent).

    A connection the server said was idle after an earlier op of this process's (to the same
    endpoint with the same files) is used again when there is one: no TCP connect, no
    handshake."""
    try:
        host, port = split_endpoint(endpoint)
    except ValueError as error:
        raise ServerError("unavailable", str(error)) from None
    context = _context_for(files)
    key = (endpoint, files)
    connection = _IDLE.take(key)
    if connection is None:
        deadline = time.monotonic() + (_CONNECT_SECONDS if timeout is None else timeout)
        sock = _connect_tcp(host, port, deadline)
        try:
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            try:
                tls = context.ssl.wrap_bio(incoming, outgoing, server_hostname=host,
                                           session=context.session_for(endpoint))
            except (ssl.SSLError, ValueError) as error:
                raise ServerError("unavailable", f"TLS: cannot check the server's name "
                                  f"'{host}': {_reasons(error)}") from None
            _handshake(sock, tls, outgoing, incoming, endpoint, deadline)
        except BaseException:
            sock.close()
            raise
        connection = _Connection(sock, tls, incoming, outgoing)
    try:
        app, relay_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as error:
        connection.close()
        raise ServerError("unavailable", f"socketpair: {error.strerror or error}") from None
    app.settimeout(timeout)
    relay = _Relay(connection, relay_end, endpoint, context, key)
    try:
        threading.Thread(target=relay.run, name="rlm-tls-relay", daemon=True).start()
    except RuntimeError as error:
        relay.close()
        app.close()
        raise ServerError("unavailable", f"no thread for the TLS relay: {error}") from None
    return app


class _Connection:
    """One TLS connection: its TCP socket, and the TLS object over the socket's bytes."""

    def __init__(self, sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        self.sock = sock
        self.tls = tls
        self.incoming = incoming
        self.outgoing = outgoing

    def close(self) -> None:
        """Sends close_notify (not waiting for the server's), then closes the socket."""
        try:
            self.tls.unwrap()
        except (ssl.SSLError, ValueError, OSError):
            pass
        try:
            data = self.outgoing.read()
            if data:
                self.sock.setblocking(False)
                self.sock.send(data)
        except OSError:
            pass
        self.sock.close()


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _IdleConnections:
    """Connections the server said were idle between ops (``{"op":"idle"}``), kept for this
    process's next op on the same endpoint with the same files, as the C++ client keeps them
    (runtime/server/tls_relay.cpp): at most 8 per endpoint, each for 20 s (the server keeps one
    30 s). A relay whose client's code has hung up after an op parks its connection soon: the
    next op waits up to 0.1 s for it rather than making a new one."""

    _KEEP = 20.0
    _PER_KEY = 8
    _KEYS = 4096
    _WAIT = 0.1

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._idle: Dict[tuple, List[Tuple[_Connection, float]]] = {}
        self._live: Dict[tuple, set] = {}

    def after_fork_in_child(self) -> None:
        """A child process shares the parent's sockets: it drops them (no close_notify: the
        parent's connections go on) and starts with none."""
        for parked in self._idle.values():
            for connection, _ in parked:
                connection.sock.close()
        self._reset()

    def take(self, key: tuple) -> Optional[_Connection]:
        stale: List[_Connection] = []
        give_up = time.monotonic() + self._WAIT
        found: Optional[_Connection] = None
        with self._changed:
            while found is None:
                parked = self._idle.get(key, [])
                while parked and found is None:
                    connection, since = parked.pop()
                    # Readable while idle means the server closed it (or broke the protocol).
                    if time.monotonic() - since < self._KEEP and not _readable(connection.sock):
                        found = connection
                    else:
                        stale.append(connection)
                if not parked:
                    self._idle.pop(key, None)
                remaining = give_up - time.monotonic()
                if found is not None or remaining <= 0 or not self._finishing(key):
                    break
                self._changed.wait(remaining)
        for connection in stale:
            connection.close()
        return found

    def park(self, key: tuple, connection: _Connection) -> bool:
        """Keeps `connection` for the next op; False when there is no room (the caller closes
        it)."""
        with self._changed:
            kept = False
            if len(self._idle) < self._KEYS or key in self._idle:
                parked = self._idle.setdefault(key, [])
                if len(parked) < self._PER_KEY:
                    parked.append((connection, time.monotonic()))
                    kept = True
            self._changed.notify_all()
            return kept

    def enter(self, key: tuple, relay: "_Relay") -> None:
        with self._changed:
            self._live.setdefault(key, set()).add(relay)

    def leave(self, key: tuple, relay: "_Relay") -> None:
        with self._changed:
            live = self._live.get(key)
            if live is not None:
                live.discard(relay)
                if not live:
                    del self._live[key]
            self._changed.notify_all()

    def _finishing(self, key: tuple) -> bool:
        """Whether a relay of `key` has its client's code gone (its end hung up, or the relay
        waits for the server's "idle"): it parks its connection soon."""
        for relay in self._live.get(key, ()):
            if relay.app_gone is not None:
                return True
            poller = select.poll()
            poller.register(relay.app_fd, select.POLLIN)
            for _, events in poller.poll(0):
                if events & select.POLLHUP:
                    return True
        return False


_IDLE = _IdleConnections()


def _after_fork_in_child() -> None:
    global _contexts_lock
    _contexts_lock = threading.Lock()
    _IDLE.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the relay -----------------------------------------------------------------------------------

def _data_frame(stream: int, data: bytes) -> bytes:
    # The wire's canonical form (tests/golden/server_wire.json): compact, keys sorted.
    body = b'{"data":"%s","op":"data","stream":%d}' % (base64.b64encode(data), stream)
    return struct.pack(">I", len(body)) + body


def _eof_frame(stream: int) -> bytes:
    body = b'{"op":"eof","stream":%d}' % stream
    return struct.pack(">I", len(body)) + body


def _encoded(frame: dict) -> bytes:
    body = json.dumps(frame, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")
    return struct.pack(">I", len(body)) + body


def _stream_of(frame: dict) -> int:
    stream = frame.get("stream")
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream <= 0x7FFFFFFF:
        raise _Broken("a data or eof frame without a stream id")
    return stream


def _data_of(frame: dict) -> bytes:
    text = frame.get("data")
    if not isinstance(text, str):
        raise _Broken('a data frame without "data" (base64)')
    if len(text) % 4 or len(text) > 4 * (STREAM_CHUNK // 3 + 1):
        raise _Broken('a data frame\'s "data" is not base64 of at most 48 KiB')
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise _Broken('a data frame\'s "data" is not base64') from None


def _write_whole(fd: int, data: bytes) -> bool:
    """All of `data` into `fd` (the client's: its blocking mode as it is); False once its reader
    is gone."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(1000)
        except OSError:
            return False
    return True


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class _Relay:
    """The relay of one connection; lives on its own thread until either side ends, or until
    the server says the op is over (``{"op":"idle"}``) and the connection is parked for the
    next one (the client's code then sees its end of file, as from the unix socket)."""

    def __init__(self, connection: _Connection, app: socket.socket, endpoint: str,
                 context: _Context, key: tuple) -> None:
        self.connection = connection
        self.sock = connection.sock
        self.tls = connection.tls
        self.incoming = connection.incoming
        self.outgoing = connection.outgoing
        self.app = app
        self.app_fd = app.fileno()
        self.endpoint = endpoint
        self.context = context
        self.key = key
        self.next_id = 1
        self.sources: Dict[int, int] = {}       # in: fds we read and send
        self.sinks: Dict[int, int] = {}         # out, file_out: where the server's bytes go
        self.ours: set = set()                  # every stream id we send on (in, file_in)
        self.buffer = bytearray()               # the server's bytes of the frame being gathered
        self.passing = 0                        # bytes of a large frame still to pass on
        self.ticket_kept = False
        self.sending = False                    # in _flush: a read meanwhile does not flush
        self.op_begun = False                   # the client's code sent the server something
        self.idle = False                       # the server said the op is over
        self.sent_after_idle = False            # and the client's code sent more: not reusable
        self.parked = False                     # the connection went to the idle ones
        #: Once the client's code hung up in an op: until when the server's "idle" is waited
        #: for (what else the server sends is dropped).
        self.app_gone: Optional[float] = None
        _IDLE.enter(key, self)

    def run(self) -> None:
        try:
            self.sock.setblocking(False)  # sends wait in _flush, reading the server meanwhile
            self.app.settimeout(_FRAME_SECONDS)
            self._loop()
        except (_Client, _ServerEnded):
            pass  # the client's code left, or the server did: its code sees EOF
        except Exception as error:  # noqa: BLE001 - whatever ends it, the client's code hears why
            why = str(error) if isinstance(error, _Broken) else _reasons(error)
            if isinstance(error, ssl.SSLError):
                # With TLS 1.3 a certificate the server rejects is told (an alert) only after
                # the handshake, on the first read.
                why = "TLS: " + explain(why)
            if not self.passing and self.app_gone is None:  # not inside a frame passed on
                try:
                    self.app.settimeout(1.0)
                    self.app.sendall(_encoded({
                        "op": "error", "kind": "unavailable",
                        "message": f"TLS connection to {self.endpoint}: {why}"}))
                except OSError:
                    pass
        finally:
            self.close()

    def close(self) -> None:
        self._close_streams()
        _IDLE.leave(self.key, self)  # before the app's fd is closed: take() polls it
        if not self.parked:
            self.connection.close()
        self.app.close()

    def _close_streams(self) -> None:
        for fd in list(self.sources.values()) + list(self.sinks.values()):
            _close(fd)
        self.sources.clear()
        self.sinks.clear()

    def _park(self) -> bool:
        """The connection to the idle ones, when nothing of an op is left on it."""
        if self.sources or self.sinks or self.buffer or self.passing or self.sending or \
                self.sent_after_idle:
            return False
        self.parked = _IDLE.park(self.key, self.connection)
        return self.parked

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        sock_fd, app_fd = self.sock.fileno(), self.app_fd
        while True:
            if self.idle:
                self._park()
                return  # the op is over: the client's code sees EOF, as from the unix socket
            poller = select.poll()
            poller.register(sock_fd, select.POLLIN)
            by_fd = {}
            timeout = None
            if self.app_gone is None:
                poller.register(app_fd, select.POLLIN)
                for stream, fd in self.sources.items():
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = stream
            else:
                remaining = self.app_gone - time.monotonic()
                if remaining <= 0:
                    return  # no "idle" in time: the connection is closed
                timeout = remaining * 1000 + 1
            ready = dict(poller.poll(timeout))
            if ready.get(sock_fd) and not self._from_server():
                return  # the server ended: the client's code sees EOF
            if self.idle:
                continue
            if ready.get(app_fd) and self.app_gone is None and not self._from_app():
                # The client's code is done with the connection.
                if not self.op_begun and self._park():
                    return  # it asked nothing: the connection is idle as it was
                # As a unix client's hangup: the server ends the op (a run stops), then says
                # "idle"; what it sends meanwhile nobody reads.
                self._close_streams()
                self._to_server(_encoded({"op": "hangup"}))
                self.app_gone = time.monotonic() + 1.0
                continue
            for fd, stream in by_fd.items():
                if ready.get(fd):
                    self._read_source(stream)

    # -- to the server ---------------------------------------------------------------------------

    def _to_server(self, data: bytes) -> None:
        if self.idle:
            self.sent_after_idle = True
        view = memoryview(data)
        for start in range(0, len(view), 1 << 18):
            self.tls.write(view[start:start + (1 << 18)])
            self._flush()

    def _flush(self) -> None:
        """What the TLS layer has for the server, sent within _FRAME_SECONDS. While the server
        does not read, what it sends is read and passed on: a server that waits for us to read
        (a run's output) before it reads again (the run's input) is never deadlocked with us."""
        if self.sending:
            return  # the outer _flush sends it after what it holds
        data = self.outgoing.read()
        if not data:
            return
        view = memoryview(data)
        deadline = time.monotonic() + _FRAME_SECONDS
        fd = self.sock.fileno()
        self.sending = True
        try:
            while True:
                try:
                    view = view[self.sock.send(view):]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as error:
                    # A server that rejected us said why (an alert) before it closed: that, not
                    # the broken pipe, is what the client's code needs.
                    self._alert_or(error)
                if not view:
                    view = memoryview(self.outgoing.read())  # what a read meanwhile added
                    if not view:
                        return
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Broken("TLS: the server did not read in time")
                poller = select.poll()
                poller.register(fd, select.POLLOUT | select.POLLIN)
                ready = dict(poller.poll(remaining * 1000 + 1))
                events = ready.get(fd, 0)
                if events & select.POLLIN and not events & select.POLLOUT:
                    if not self._from_server():
                        raise _ServerEnded()
        finally:
            self.sending = False

    def _alert_or(self, error: OSError) -> None:
        try:
            self.sock.settimeout(0.5)
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                self.incoming.write(data)
                try:
                    while True:
                        plain = self.tls.read(1 << 16)
                        if not plain:
                            break
                        self._server_bytes(plain)  # an error frame of the server's, say
                except ssl.SSLWantReadError:
                    continue
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    break
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            pass
        except ssl.SSLError:
            raise  # the alert: why the server closed
        except OSError:
            pass
        if isinstance(error, socket.timeout):
            raise _Broken("TLS: the server did not read in time") from None
        raise _Broken(f"TLS: {_reasons(error)}") from None

    def _from_app(self) -> bool:
        """One frame of the client's code on to the server; its fds become streams. False at
        the end of the client's code's connection."""
        fds: List[int] = []
        try:
            header = self._app_read(4, fds)
            if header is None:
                return False
            (length,) = struct.unpack(">I", header)
            if length > _MAX_FRAME:
                raise _Broken(f"a frame of {length} bytes from the client is over the limit")
            self.op_begun = True
            body = self._app_read(length, fds) if length else b""
            if body is None:
                raise _Broken("the client's code ended inside a frame")
            if not fds:
                self._to_server(header + body)
                return True
            try:
                frame = decode_json(body.decode("utf-8"))
            except (ValueError, RecursionError) as error:
                raise _Broken(f"the client's code sent a malformed frame: {error}") from None
            op = frame.get("op") if isinstance(frame, dict) else None
            kinds = _STREAM_KINDS.get(op) if isinstance(op, str) else None
            if kinds is None or len(kinds) != len(fds):
                raise _Broken(f'op "{op}" does not carry {len(fds)} fds over TLS')
            declared = []
            files_in = []
            for kind, fd in zip(kinds, fds):
                stream = self.next_id
                self.next_id += 1
                declared.append({"id": stream, "kind": kind})
                if kind == "in":
                    self.sources[stream] = fd
                    self.ours.add(stream)
                elif kind == "file_in":
                    files_in.append((stream, fd))
                    self.ours.add(stream)
                else:
                    self.sinks[stream] = fd
            fds = []  # ours to close now, in the maps or files_in
            frame["streams"] = declared
            try:
                self._to_server(_encoded(frame))
                for stream, fd in files_in:
                    self._send_file(stream, fd)
            finally:
                for _, fd in files_in:
                    _close(fd)
            return True
        finally:
            for fd in fds:
                _close(fd)

    def _app_read(self, size: int, fds: List[int]) -> Optional[bytes]:
        """Exactly `size` bytes of the client's code (fds that come with them added to `fds`);
        None at its end before the first byte."""
        chunks = []
        got = 0
        while got < size:
            try:
                data, passed, _, _ = socket.recv_fds(self.app, min(size - got, 1 << 20),
                                                     _MAX_FDS)
            except socket.timeout:
                raise _Broken("the client's code did not finish its frame in time") from None
            except OSError:
                data, passed = b"", []
            fds.extend(passed)
            if not data:
                if got == 0:
                    return None
                raise _Broken("the client's code ended inside a frame")
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)

    def _send_file(self, stream: int, fd: int) -> None:
        """A file_in stream's whole file, read from its start, then its eof."""
        offset = 0
        while True:
            try:
                data = os.pread(fd, STREAM_CHUNK, offset)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            offset += len(data)
            self._to_server(_data_frame(stream, data))
        self._to_server(_eof_frame(stream))

    def _read_source(self, stream: int) -> None:
        fd = self.sources.get(stream)
        if fd is None:
            return
        try:
            data = os.read(fd, STREAM_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            del self.sources[stream]
            _close(fd)
            self._to_server(_eof_frame(stream))
            return
        self._to_server(_data_frame(stream, data))

    # -- from the server -------------------------------------------------------------------------

    def _from_server(self) -> bool:
        """What the server sent: its frames on. False at its end."""
        try:
            data = self.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return True
        except OSError:
            data = b""  # a reset: as the end (what came before it is read first)
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        ended = False
        while True:
            try:
                plain = self.tls.read(1 << 16)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                ended = True
                break
            if not plain:
                ended = True
                break
            self._server_bytes(plain)
        self._flush()  # what the TLS layer answers (a key update)
        self._keep_ticket()
        if ended:
            if self.buffer or self.passing:
                raise _Broken("the connection ended inside a frame")
            return False
        return True

    def _keep_ticket(self) -> None:
        """The session's ticket, once the server sent one (TLS 1.3: after the handshake), for
        the next connection to this endpoint (it skips the certificate exchange)."""
        if self.ticket_kept:
            return
        try:
            session = self.tls.session
        except (AttributeError, ValueError):
            session = None
        if session is not None and session.has_ticket:
            self.context.remember(self.endpoint, session)
            self.ticket_kept = True

    def _to_app(self, data: bytes) -> None:
        if self.app_gone is not None:
            return  # the end of an op nobody reads any more
        try:
            self.app.sendall(data)
        except OSError:
            raise _Client() from None

    def _server_bytes(self, data: bytes) -> None:
        if self.passing:
            now = data[:self.passing]
            self.passing -= len(now)
            self._to_app(now)
            data = data[len(now):]
        self.buffer += data
        while True:
            if self.passing:
                return
            if len(self.buffer) < 4:
                return
            (length,) = struct.unpack(">I", self.buffer[:4])
            if length > _MAX_FRAME:
                raise _Broken(f"a frame of {length} bytes is over the limit of {_MAX_FRAME}")
            if length > _MAX_STREAM_FRAME:  # passed on as it comes, never held whole
                have = min(len(self.buffer), 4 + length)
                self.passing = 4 + length - have
                chunk = bytes(self.buffer[:have])
                del self.buffer[:have]
                self._to_app(chunk)
                continue
            if len(self.buffer) < 4 + length:
                return
            whole = bytes(self.buffer[:4 + length])
            del self.buffer[:4 + length]
            self._server_frame(whole)

    def _server_frame(self, whole: bytes) -> None:
        try:
            frame = decode_json(whole[4:].decode("utf-8"))
        except (ValueError, RecursionError) as error:
            raise _Broken(f"the server sent a malformed frame: {error}") from None
        if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
            raise _Broken('the server sent a frame without a string "op"')
        op = frame["op"]
        if op == "idle":
            self.idle = True  # the op is over: the loop parks the connection
            return
        if op not in ("data", "eof"):
            self._to_app(whole)
            return
        stream = _stream_of(frame)
        fd = self.sinks.get(stream)
        if fd is None:
            # Ours closed (the client stopped reading): what comes after is dropped.
            if stream in self.ours:
                raise _Broken("the server sent on a stream of ours")
            return
        if op == "eof":
            del self.sinks[stream]
            _close(fd)
        elif not _write_whole(fd, _data_of(frame)):
            del self.sinks[stream]  # the reader is gone; the run's own cap or end stops the rest
            _close(fd)


class _Client(Exception):
    """The client's code closed its end while the relay was passing it a frame."""


class _ServerEnded(Exception):
    """The server ended the connection while the relay was sending to it."""
