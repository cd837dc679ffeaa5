"""The client of ``rlm-sandbox serve``, talking to the server directly over its unix socket
(docs/pools-and-server.md): :class:`Server` runs commands and code in the server's warm
sandboxes, :class:`ServerSession` is a REPL session with the same interface as
:class:`~rlm_sandbox.RlmSandbox`.

The payload's stdin, stdout and stderr are pipes this process hands the server as fds: output
never passes through the server, and this client caps each stream at the policy's
``limits.output_bytes`` (the server says the cap when the run starts), asking the server to stop
the run on overflow, as a direct run would.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from ._calls import Calls, Dispatcher, split_tools, unencodable
from ._fork import BranchOptions, checked_count, fork_branches
from ._requests import added_index, checked_allow, checked_index, execute_request, loaded
from ._requests import milliseconds as _milliseconds
from ._tls_relay import tls_files
from ._wire import ConnectionLost, ServerError, Wire, connect, raise_if_error
from .result import CellResult, LlmCallback, RlmSandboxError, RunResult

#: How long a run's pipes are drained once the server has sent its result (the sandbox is gone;
#: only a process that was handed a pipe elsewhere could keep it open).
_DRAIN_SECONDS = 2.0
_DEFAULT_OUTPUT_BYTES = 1 << 20

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.I)


def server_from_environment() -> Optional[str]:
    """The socket named by ``$RLM_SANDBOX_SERVER``, or None."""
    return os.environ.get("RLM_SANDBOX_SERVER") or None


def _bytes(value: Union[int, str], what: str) -> int:
    """Bytes (an int) or a size string ("256M") -> bytes."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"{what} {value!r}: expected e.g. 256M, 1G, 4096")
        return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[
            match.group(2).upper()]
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"{what} must be a positive number of bytes, not {value!r}")
    return int(value)


class Server:
    """A ``rlm-sandbox serve`` at a unix socket, or at its TLS listener (``serve --listen``).
    Each run or session takes a connection of its own, so one Server object serves any number
    of threads.

    Args:
        path: the server's socket, or ``"tls://HOST:PORT"`` (``tls://[V6]:PORT``) of its TLS
            listener; default ``$RLM_SANDBOX_SERVER``.
        connect_timeout: seconds to wait for the server to accept and answer a short request
            (over TLS: the TCP connect and the handshake).
        server_uid: a uid the server may run as besides root and this process's own; default
            ``$RLM_SANDBOX_SERVER_UID``. A listener of any other uid (another tenant who bound
            the path first) is refused with :class:`ServerError` before anything is sent.
            Not used over TLS, where the server's certificate is checked instead.
        tls_cert, tls_key: this client's certificate and its key (PEM files), which the
            server maps to a uid (``serve --tls-identity``); default ``$RLM_SANDBOX_TLS_CERT``
            and ``$RLM_SANDBOX_TLS_KEY``. Only for a ``tls://`` path.
        tls_ca: the CA the server's certificate must chain to, which must also name the host
            dialled (an IP address SAN for an address); default ``$RLM_SANDBOX_TLS_CA``. A
            server whose certificate does not verify is sent nothing.

    Over TLS (1.3 only) the protocol is the unix socket's: a relay thread per connection turns
    the fds a request hands the server (stdin, stdout, stderr, a context, a save file) into
    streams of the connection, so runs and sessions work the same. A server that rejects the
    client's certificate (none, another CA's) says so at the first answer: :class:`ServerError`
    ``unavailable`` ("the server requires a client certificate", "the server does not accept
    this client certificate"); an identity the server grants nothing is ``refused``.

    A server that cannot serve (none at the socket, a peer it does not allow, a policy it does
    not offer, a loosened policy, a bind it does not permit) raises :class:`ServerError`; nothing
    ever runs anywhere else.
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]] = None, *,
                 connect_timeout: float = 10.0, server_uid: Optional[int] = None,
                 tls_cert: Optional[Union[str, os.PathLike]] = None,
                 tls_key: Optional[Union[str, os.PathLike]] = None,
                 tls_ca: Optional[Union[str, os.PathLike]] = None) -> None:
        if path is None:
            path = server_from_environment()
        if not path:
            raise RlmSandboxError("no server: pass path= or set RLM_SANDBOX_SERVER")
        self.path = os.fspath(path)
        self.connect_timeout = connect_timeout
        self.server_uid = server_uid
        #: The TLS files (empty strings for none given), for a ``tls://`` path.
        self.tls = tls_files(tls_cert, tls_key, tls_ca)

    def _connect(self) -> Wire:
        return Wire(connect(self.path, self.connect_timeout, self.server_uid, self.tls))

    def _ask(self, frame: Dict[str, Any], answer_op: str) -> Dict[str, Any]:
        """One frame on a connection of its own and the server's one answer (`answer_op`); an
        error frame raises :class:`ServerError`."""
        wire = self._connect()
        try:
            wire.send(frame)
            return wire.expect(answer_op)
        finally:
            wire.close()

    def _ask_within(self, frame: Dict[str, Any], answer_op: str, timeout: float,
                    max_bytes: int) -> Dict[str, Any]:
        """:meth:`_ask` with one hard deadline, `timeout` seconds for the connect and the whole
        answer (not per read: a server trickling its answer is cut off), and an answer of at
        most `max_bytes`; past either, :class:`ServerError` (``unavailable`` or
        ``internal``)."""
        deadline = time.monotonic() + timeout
        wire = Wire(connect(self.path, timeout, self.server_uid, self.tls))
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerError("unavailable", "the server did not answer in time")
            wire.sock.settimeout(remaining)
            wire.send(frame)
            return wire.expect(answer_op, deadline=deadline, max_bytes=max_bytes)
        finally:
            wire.close()

    def hello(self) -> Dict[str, Any]:
        """The server's greeting: ``policies`` it offers, its ``pid``, its pools' counters."""
        return self._ask({"op": "hello", "version": 1}, "hello")

    # -- the node contract (docs/fleet.md) -------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """Whether the server is alive: ``{"alive": True, "node": ID, "pid": N}`` (and ``op``)."""
        return self._ask({"op": "health"}, "health")

    def ready(self) -> Dict[str, Any]:
        """Whether the node takes work now: ``{"node": ID, "ready": bool, "why": [str, ...]}``.
        Ready means not draining and every pool holding its minimum of warm sandboxes and
        sessions; ``why`` says what is missing otherwise."""
        return self._ask({"op": "ready"}, "ready")

    def capacity(self) -> Dict[str, Any]:
        """What the node has and holds, for placement: ``node_id``, ``version``, ``features``
        (``backends``, ``cgroup``, ``landlock_abi``, ``sessions``), ``cores``,
        ``memory_bytes``, ``memory_available_bytes``, ``max_sandboxes`` (0: no cap of its
        own), ``running``, ``starting``, ``warm_idle`` (per pool: ``sandboxes``, ``sessions``,
        ``min_sandboxes``, ``min_sessions``), ``pressure`` (``cpu``, ``memory``, ``io``: PSI's
        avg10, None without PSI), ``draining`` and ``ready``."""
        return self._ask({"op": "capacity"}, "capacity")

    def drain(self, grace: Optional[Union[int, float, str]] = None) -> Dict[str, Any]:
        """Drains the node: ready turns false and new runs and sessions are refused (kind
        ``draining``); those running get `grace` (seconds or "30s"; default the server's
        ``--drain-grace``), then end with status ``node_drained``; the server exits once
        nothing runs. Only root and the server's own uid may drain (others: ServerError
        ``refused``). Returns ``{"node": ID, "grace_ms": N}`` (and ``op``: ``draining``)."""
        frame: Dict[str, Any] = {"op": "drain"}
        if grace is not None:
            frame["grace_ms"] = _grace_milliseconds(grace)
        return self._ask(frame, "draining")

    def policy(self, name: str = "default") -> Dict[str, Any]:
        """The server's copy of an offered policy (``Policy::to_json()``), a base to tighten."""
        wire = self._connect()
        try:
            return _fetch_policy(wire, name)
        finally:
            wire.close()

    def run(self, argv: Optional[Sequence[str]] = None, *, code: Optional[str] = None,
            language: str = "python", policy: str = "default",
            overrides: Optional[Dict[str, Any]] = None,
            limits: Optional[Dict[str, Any]] = None, env: Optional[Dict[str, str]] = None,
            timeout: Optional[Union[int, float, str]] = None,
            stdin: Optional[Union[bytes, str]] = None) -> RunResult:
        """Runs a command (`argv`) or a program (`code` in `language`) in a sandbox of the
        offered `policy`; returns how it ended, with its output.

        Args:
            overrides: a whole policy (as ``policy()`` returns it) to run instead, which the
                server accepts only when it tightens the offered one.
            limits: keys of the policy's ``limits`` to lower (``{"memory_bytes": 64 << 20}``):
                applied to the server's copy, sent as `overrides`.
            env: variables for the payload, on top of the policy's.
            timeout: the run's wall time, in seconds or as "10s" (may only tighten).
            stdin: the payload's input; default: none (``/dev/null``).
        """
        if (argv is None) == (code is None):
            raise ValueError("give argv or code, not both and not neither")
        request: Dict[str, Any] = ({"argv": [str(a) for a in argv]} if argv is not None
                                   else {"code": code, "language": language})
        if env:
            request["env"] = {str(k): str(v) for k, v in env.items()}
        if timeout is not None:
            request["timeout_ms"] = _milliseconds(timeout, "timeout")
        request["stdin"] = "null" if stdin is None else "fd"
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin

        wire = self._connect()
        try:
            if limits:
                overrides = dict(overrides or _fetch_policy(wire, policy))
                overrides["limits"] = {**overrides.get("limits", {}), **limits}
            frame: Dict[str, Any] = {"op": "run", "policy": policy, "request": request}
            if overrides is not None:
                frame["overrides"] = overrides
            return _Run(wire, frame, data, self.path).result()
        finally:
            wire.close()

    def session(self, policy: str = "python-repl", **options: Any) -> "ServerSession":
        """A REPL session in one of the server's sandboxes (see :class:`ServerSession`)."""
        return ServerSession(self, policy, **options)

    def restore_session(self, path: Union[str, os.PathLike], policy: str = "python-repl",
                        **options: Any) -> "ServerSession":
        """A session holding the state saved at `path` (:meth:`ServerSession.restore_from`)."""
        return ServerSession.restore_from(path, self, policy, **options)


def _grace_milliseconds(grace: Union[int, float, str]) -> int:
    """A drain's grace (seconds, 0 included, or a duration string such as "30s") -> ms."""
    if isinstance(grace, str):
        return _milliseconds(grace, "grace")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
        raise ValueError(f"grace must be a number of seconds (0 or more), not {grace!r}")
    return round(grace * 1000)


def _node_lost(node: str, path: str, how: str) -> str:
    """Why a session (or a run under way) ended when its server went away without a word, as
    the C++ client says it (docs/fleet.md)."""
    who = f"node {node}" if node else (f"the server at {path}" if path else "the server")
    return f"node_lost: {who} is gone ({how})"


def _fetch_policy(wire: Wire, name: str) -> Dict[str, Any]:
    wire.send({"op": "policy", "policy": name})
    policy = wire.expect("policy").get("policy")
    if not isinstance(policy, dict):
        raise ServerError("internal", "the server sent no policy")
    return policy


class _Run:
    """One run's connection: the request with its three fds, then the pipes and the socket
    watched together until the result, with the output capped here. The connection lost once
    the run has started is ServerError ``node_lost``, not ``unavailable``: the run may have done
    its work, so a fleet must not start it again elsewhere."""

    def __init__(self, wire: Wire, frame: Dict[str, Any], stdin: Optional[bytes],
                 path: str = "") -> None:
        self.wire = wire
        self.path = path
        self.frame = frame
        self.stdin = stdin
        self.output: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = {"stdout": False, "stderr": False}
        self.stopped = False
        #: The fds result() closes on its way out (one closed earlier leaves the list first).
        self._to_close: List[int] = []

    def result(self) -> RunResult:
        to_close = self._to_close
        try:
            if self.stdin is None:
                in_read = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                in_write = -1
            else:
                in_read, in_write = os.pipe2(os.O_CLOEXEC)
                to_close.append(in_write)
            to_close.append(in_read)
            out_read, out_write = os.pipe2(os.O_CLOEXEC)
            err_read, err_write = os.pipe2(os.O_CLOEXEC)
            to_close += [out_read, out_write, err_read, err_write]
            self.wire.send(self.frame, [in_read, out_write, err_write])
            # Only the sandbox holds the write ends now: its end is the pipes' end.
            for fd in (in_read, out_write, err_write):
                os.close(fd)
                to_close.remove(fd)
            started = self.wire.expect("started")
            cap = started.get("output_bytes")
            self.cap = int(cap) if isinstance(cap, int) and cap >= 0 else _DEFAULT_OUTPUT_BYTES
            try:
                reply = self._watch({out_read: "stdout", err_read: "stderr"}, in_write)
            except ConnectionLost as error:
                raise ServerError("node_lost", _node_lost("", self.path, str(error))
                                  + "; the run had started") from error
        finally:
            for fd in to_close:
                try:
                    os.close(fd)
                except OSError:
                    pass
        result = dict(reply.get("result") or {})
        for stream in ("stdout", "stderr"):
            result[stream] = bytes(self.output[stream]).decode("utf-8", "replace")
            result[f"{stream}_truncated"] = (bool(result.get(f"{stream}_truncated"))
                                             or self.truncated[stream])
        return RunResult.from_json(result)

    def _watch(self, readers: Dict[int, str], in_write: int) -> Dict[str, Any]:
        selector = selectors.DefaultSelector()
        try:
            selector.register(self.wire.sock, selectors.EVENT_READ, "socket")
            for fd, stream in readers.items():
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ, stream)
            pending = memoryview(self.stdin or b"")
            if in_write >= 0:
                os.set_blocking(in_write, False)
                selector.register(in_write, selectors.EVENT_WRITE, "stdin")
            reply: Optional[Dict[str, Any]] = None
            drain_until = None
            while True:
                open_pipes = [key for key in selector.get_map().values()
                              if key.data in ("stdout", "stderr")]
                if reply is not None and (not open_pipes or time.monotonic() >= drain_until):
                    return reply
                wait = None if drain_until is None else max(0.0, drain_until - time.monotonic())
                for key, _ in selector.select(wait):
                    if key.data == "socket":
                        frame = self.wire.receive()
                        raise_if_error(frame)
                        if frame["op"] == "result":
                            reply = frame
                            drain_until = time.monotonic() + _DRAIN_SECONDS
                            selector.unregister(self.wire.sock)
                    elif key.data == "stdin":
                        try:
                            pending = pending[os.write(in_write, pending[:65536]):]
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:  # EPIPE: the payload does not read its input
                            pending = pending[len(pending):]
                        if not pending:
                            selector.unregister(in_write)
                            # Closed once: the number may be another thread's fd after this.
                            self._to_close.remove(in_write)
                            os.close(in_write)  # the payload sees end of input
                    else:
                        self._read(selector, key.fd, key.data)
        finally:
            selector.close()

    def _read(self, selector: selectors.BaseSelector, fd: int, stream: str) -> None:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            selector.unregister(fd)
            return
        kept = self.output[stream]
        room = self.cap - len(kept)
        kept += data[:max(0, room)]
        if len(data) > room:
            self.truncated[stream] = True
            selector.unregister(fd)  # a payload that writes on meets a closed pipe
            if not self.stopped:
                self.stopped = True
                self.wire.send({"op": "stop", "reason": "output_limit", "stream": stream})


def _context_fd(context: Any, context_file: Any, context_json: bool):
    """The context as an fd the server reads to its end: the file, opened here with this
    process's rights, or a memfd holding the text. Returns (fd or None, is_json)."""
    if context is not None and context_file is not None:
        raise ValueError("give context or context_file, not both")
    if context_file is not None:
        return os.open(os.fspath(context_file), os.O_RDONLY | os.O_CLOEXEC), context_json
    if context is None:
        return None, False
    return _value_fd(context, context_json)


def _value_fd(value: Any, as_json: bool):
    """A memfd holding `value`: a str as text (unless `as_json`), anything else as JSON.
    Returns (fd, is_json)."""
    as_json = as_json or not isinstance(value, str)
    text = (json.dumps(value, ensure_ascii=False, allow_nan=False) if as_json else value)
    fd = os.memfd_create("rlm-sandbox-context", os.MFD_CLOEXEC)
    try:
        view = memoryview(text.encode("utf-8"))
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd, as_json


def _check_saved_size(fd: int, result: CellResult) -> None:
    """The file the server wrote is as long as the result says (else it is not kept)."""
    size = (result.saved or {}).get("bytes")
    if isinstance(size, int) and not isinstance(size, bool) and os.fstat(fd).st_size != size:
        raise RlmSandboxError(f"the save file is {os.fstat(fd).st_size} bytes; the server "
                              f"wrote {size}")


class ServerSession:
    """A REPL session in one of a server's warm sandboxes, with the interface of
    :class:`~rlm_sandbox.RlmSandbox`: ``execute``, ``snapshot``, ``restore``, ``save``,
    ``load``, ``fork``, ``close``, a context manager, and ``on_llm_query`` answering the cell's
    ``llm_query`` calls.

    Args:
        server: a :class:`Server` or its socket path.
        policy: an offered policy name.
        context, context_file, context_json: the REPL's ``context`` (as RlmSandbox takes them).
        on_llm_query: the default ``callback(prompt, model) -> str``; None: calls fail in the
            cell unless ``execute`` is given one.
        on_rlm_query, tools, tool_encoding, echo: as RlmSandbox takes them.
        llm_timeout, llm_budget, llm_concurrency: the session's LM limits, each only tightening
            the server's (seconds or "30s"; counts).
        max_llm_workers: callbacks run at once on a thread pool (1: on the reading thread);
            default ``llm_concurrency``, else 16.
        timeout: the session's wall time limit, and memory: its memory limit, each only
            tightening the offered policy (seconds or "30s"; bytes or "256M").
        overrides: a whole tightened policy to run instead of the offered one.
        lifetime: seconds the session may live (the server ends it then).

    When the session's connection ends with no answer (its server killed or gone), the call
    under way raises :class:`ServerError` ``node_lost`` saying ``node_lost: node ID is gone
    (...)``, and so does every later call; ``close()`` then returns a Result saying so.
    """

    def __init__(self, server: Union[Server, str, os.PathLike, None] = None,
                 policy: str = "python-repl", *, context: Any = None,
                 context_file: Optional[Union[str, os.PathLike]] = None,
                 context_json: bool = False, on_llm_query: Optional[LlmCallback] = None,
                 on_rlm_query: Optional[LlmCallback] = None,
                 tools: Optional[Dict[str, Any]] = None, tool_encoding: str = "json",
                 echo: bool = True,
                 llm_timeout: Optional[Union[int, float, str]] = None,
                 llm_budget: Optional[int] = None, llm_concurrency: Optional[int] = None,
                 max_llm_workers: Optional[int] = None,
                 timeout: Optional[Union[int, float, str]] = None,
                 memory: Optional[Union[int, str]] = None,
                 overrides: Optional[Dict[str, Any]] = None,
                 lifetime: Optional[float] = None) -> None:
        self._wire: Optional[Wire] = None
        self._closed = False
        self._close_result: Dict[str, Any] = {}
        #: Why the session is over when its connection ended with no answer (node_lost).
        self._lost: Optional[str] = None
        self._lock = threading.RLock()
        self._dispatcher = Dispatcher(int(max_llm_workers or llm_concurrency or 16),
                                      self._send_answer)
        tool_specs, self._tool_functions = split_tools(tools, tool_encoding)
        self.on_rlm_query = on_rlm_query
        self.on_llm_query = on_llm_query
        self.server = server if isinstance(server, Server) else Server(server)
        self.policy = policy
        self.backend: Optional[str] = None
        #: The node that serves the session (the server's ``--node-id``), and the session's id
        #: there, ``"NODE/NUMBER"``: it names its node, so a fleet's client finds it without
        #: shared state. Empty from a server that does not say.
        self.node = ""
        self.session_id = ""
        #: What fork() opens each branch with besides the server and policy: these options but
        #: the context (a branch takes its contexts from the parent's state); the callbacks are
        #: the parent's at the time of the fork.
        self._fork_options: Dict[str, Any] = dict(
            tools=tools, tool_encoding=tool_encoding, echo=echo, llm_timeout=llm_timeout,
            llm_budget=llm_budget, llm_concurrency=llm_concurrency,
            max_llm_workers=max_llm_workers, timeout=timeout, memory=memory,
            overrides=overrides, lifetime=lifetime)

        fd, as_json = _context_fd(context, context_file, context_json)
        wire = self.server._connect()
        try:
            if timeout is not None or memory is not None:
                overrides = dict(overrides or _fetch_policy(wire, policy))
                limits = dict(overrides.get("limits", {}))
                if timeout is not None:
                    limits["wall_time_ms"] = _milliseconds(timeout, "timeout")
                if memory is not None:
                    limits["memory_bytes"] = _bytes(memory, "memory")
                overrides["limits"] = limits
            options: Dict[str, Any] = {"context_is_json": as_json, "llm": "client"}
            if lifetime is not None:
                options["lifetime_ms"] = _milliseconds(lifetime, "lifetime")
            if llm_timeout is not None:
                options["llm_timeout_ms"] = _milliseconds(llm_timeout, "llm_timeout")
            for key, count in (("llm_budget", llm_budget), ("llm_concurrency", llm_concurrency)):
                if count is not None:
                    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                        raise ValueError(f"{key} must be a positive int, not {count!r}")
                    options[key] = count
            # Sent only when asked for: a server without them refuses the session, saying so.
            if not echo:
                options["echo"] = False
            if tool_specs:
                options["tools"] = tool_specs
            frame: Dict[str, Any] = {"op": "session_open", "policy": policy, "options": options}
            if overrides is not None:
                frame["overrides"] = overrides
            # No read timeout from here on: a cell runs as long as its policy lets it, and the
            # server bounds that.
            wire.sock.settimeout(None)
            wire.send(frame, [fd] if fd is not None else [])
            if fd is not None:
                os.close(fd)
                fd = None
            opened = wire.expect("session_opened")
            self.backend = opened.get("backend")
            self.node = str(opened.get("node") or "")
            self.session_id = str(opened.get("session_id") or "")
        except BaseException:
            wire.close()
            raise
        finally:
            if fd is not None:
                os.close(fd)
        self._wire = wire

    # -- public API (RlmSandbox's) ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._wire is not None and not self._closed and self._lost is None

    def execute(self, code: str, on_llm_query: Optional[LlmCallback] = None,
                timeout: Optional[float] = None, *, locals: bool = False,
                fetch: Optional[str] = None) -> CellResult:
        """Runs one cell and returns its result (RlmSandbox.execute)."""
        calls = Calls(on_llm_query or self.on_llm_query, self.on_rlm_query, self._tool_functions)
        reply = self._request(execute_request(code, timeout, locals, fetch), "cell_result", calls)
        return CellResult.from_json(reply.get("result") or {})

    def add_context(self, value: Any, index: Optional[int] = None) -> int:
        """Adds ``context_N`` to the live session (RlmSandbox.add_context); the value crosses
        as an fd (a memfd of this process), never inside a frame."""
        return self._add("context", value, index)

    def add_history(self, messages: List[Dict[str, Any]], index: Optional[int] = None) -> int:
        """Adds ``history_N`` to the live session (RlmSandbox.add_history)."""
        if not isinstance(messages, list):
            raise TypeError(f"messages must be a list, not {type(messages).__name__}")
        return self._add("history", messages, index)

    def snapshot(self) -> int:
        """Takes a copy-on-write snapshot of the interpreter; returns its id for restore()."""
        return int(self._request({"op": "snapshot"}, "snapshot")["id"])

    def restore(self, snapshot_id: int) -> None:
        """Replaces the interpreter's state with a fresh copy of a snapshot (reusable)."""
        self._request({"op": "restore", "id": int(snapshot_id)}, "restored")

    def save(self, path: Union[str, os.PathLike]) -> CellResult:
        """Saves the session's state to `path` (RlmSandbox.save). This process creates the file:
        a temporary one beside `path` (mode 0600) whose fd the server writes, renamed onto
        `path` once the save is ``ok``; removed otherwise, so a failed save leaves no partial
        file and an existing file at `path` as it was."""
        target = os.path.abspath(os.fspath(path))
        directory, name = os.path.split(target)
        try:
            fd, partial = tempfile.mkstemp(prefix=f".{name[:200]}.", suffix=".partial",
                                           dir=directory)
        except OSError as error:
            raise RlmSandboxError(f"cannot create a file in '{directory}': "
                                  f"{error.strerror or error}") from error
        done = False
        try:
            try:
                reply = self._request({"op": "save"}, "cell_result", fds=[fd])
                result = CellResult.from_json(reply.get("result") or {})
                if result.ok:
                    _check_saved_size(fd, result)
                    os.fsync(fd)
            finally:
                os.close(fd)
            if result.ok:
                os.replace(partial, target)
                done = True
            return result
        except OSError as error:  # fsync, rename: the file is not where it should be
            raise RlmSandboxError(f"cannot save to '{target}': {error.strerror or error}"
                                  ) from error
        finally:
            if not done:
                try:
                    os.unlink(partial)
                except OSError:
                    pass

    def load(self, path: Union[str, os.PathLike]) -> CellResult:
        """Replaces the session's state with the one saved at `path` (RlmSandbox.load): the
        file, opened read-only here, crosses as an fd; the server checks it before the sandbox
        reads it. An error frame (a refused file) raises ServerError; the session goes on."""
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as error:
            raise RlmSandboxError(f"cannot open the save file '{os.fspath(path)}': "
                                  f"{error.strerror or error}") from error
        try:
            reply = self._request({"op": "load"}, "cell_result", fds=[fd])
        finally:
            os.close(fd)
        return CellResult.from_json(reply.get("result") or {})

    @classmethod
    def restore_from(cls, path: Union[str, os.PathLike],
                     server: Union[Server, str, os.PathLike, None] = None,
                     policy: str = "python-repl", **options: Any) -> "ServerSession":
        """A new session (``ServerSession(server, policy, **options)``) holding the state saved
        at `path`; the session is closed again when the file is refused or cannot be loaded
        (RlmSandboxError, or ServerError for the server's refusal)."""
        session = cls(server, policy, **options)
        try:
            loaded(session.load(path), path)
        except BaseException:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - the load's error is the one to raise
                session._closed = True
                session._shutdown()
            raise
        return session

    def fork(self, n: int) -> List["ServerSession"]:
        """`n` new sessions (1 to 64) on the same server, each in a sandbox of its own, holding
        this session's state as it is now (RlmSandbox.fork): one save into a private temporary
        directory (removed on every path), then the branches opened with this session's policy
        and options (limits, overrides, lifetime, tools, LM limits; the callbacks as they are
        now; not the context: it comes with the state) and loaded from that file concurrently.

        Raises:
            ValueError: `n` is not an int from 1 to 64.
            RlmSandboxError: this session could not be saved, or a branch could not be opened or
                loaded (the message names which; every branch opened is closed first). This
                session goes on unchanged either way.
        """
        return self._fork(n, None)

    def _fork(self, n: int, branch_options: BranchOptions) -> List["ServerSession"]:
        """fork(), with `branch_options(index)` replacing options per branch."""
        checked_count(n)

        def open_branch(index: int) -> "ServerSession":
            options = {**self._fork_options, "on_llm_query": self.on_llm_query,
                       "on_rlm_query": self.on_rlm_query}
            if branch_options is not None:
                options.update(branch_options(index))
            return type(self)(self.server, self.policy, **options)

        return fork_branches(n, self.save, open_branch, lambda branch, path: branch.load(path),
                             ServerSession._discard)

    def narrow_network(self, allow: List[str]) -> None:
        """Narrows the session's egress allowlist while it runs (RlmSandbox.narrow_network)."""
        self._request({"op": "narrow_network", "allow": checked_allow(allow)}, "narrowed")

    def close(self) -> Dict[str, Any]:
        """Ends the session; returns the sandbox's Result dict. Idempotent. A session whose node
        was lost (its connection ended with no answer, before or during the close) returns
        ``{"status": "sandbox_error", "node": ..., "detail": "node_lost: ..."}``."""
        with self._lock:
            if self._closed:
                return self._close_result
            try:
                if self._wire is not None and self._lost is None:
                    try:
                        self._close_result = dict(
                            self._request({"op": "close"}, "closed").get("result") or {})
                    except ServerError as error:
                        if error.kind != "node_lost":
                            raise
                if self._lost is not None:
                    self._close_result = {"status": "sandbox_error", "node": self.node,
                                          "detail": self._lost}
            finally:
                self._closed = True
                self._shutdown()
            return self._close_result

    def __enter__(self) -> "ServerSession":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - do not hide the exception that is propagating
            self._closed = True
            self._shutdown()

    def __del__(self) -> None:
        # A session nobody closed: the server closes it when the connection goes.
        if not getattr(self, "_closed", True):
            self._closed = True
            self._shutdown()

    def __repr__(self) -> str:
        return (f"ServerSession(server={self.server.path!r}, policy={self.policy!r}, "
                f"backend={self.backend!r}, session_id={self.session_id!r}, "
                f"{'closed' if self._closed else 'open'})")

    # -- internals -------------------------------------------------------------------------------

    @staticmethod
    def _discard(session: "ServerSession") -> None:
        """Closes `session`, or drops its connection (the server then closes it)."""
        try:
            session.close()
        except Exception:  # noqa: BLE001
            session._closed = True
            session._shutdown()

    def _shutdown(self) -> None:
        if self._wire is not None:
            self._wire.close()
        self._dispatcher.shutdown()

    def _add(self, kind: str, value: Any, index: Optional[int]) -> int:
        frame: Dict[str, Any] = {"op": "add_context", "kind": kind}
        if index is not None:
            frame["index"] = checked_index(index)
        fd, as_json = _value_fd(value, kind == "history")
        try:
            frame["format"] = "json" if as_json else "text"
            reply = self._request(frame, "cell_result", fds=[fd])
        finally:
            os.close(fd)
        return added_index(reply.get("result") or {})

    def _request(self, frame: Dict[str, Any], answer_op: str, calls: Optional[Calls] = None,
                 fds: Sequence[int] = ()) -> Dict[str, Any]:
        with self._lock:
            if self._closed or self._wire is None:
                raise RlmSandboxError("the session is closed")
            if self._lost is not None:
                raise ServerError("node_lost", f"the session is over: {self._lost}")
            wire = self._wire
            try:
                wire.send(frame, fds)
                while True:
                    reply = wire.receive()
                    if reply["op"] == "llm_call":
                        self._answer(reply, calls)
                        continue
                    raise_if_error(reply)
                    if reply["op"] != answer_op:
                        raise ServerError("internal", f"the server answered {reply['op']!r} "
                                          f"where {answer_op!r} was due")
                    return reply
            except ConnectionLost as error:
                # The connection ended with no answer: the node (or the way to it) is gone, and
                # the session with it. Every later call says so at once.
                self._lost = _node_lost(self.node, self.server.path, str(error))
                raise ServerError("node_lost", self._lost) from error

    def _answer(self, call: Dict[str, Any], calls: Optional[Calls]) -> None:
        if call.get("prompt_is_json"):  # a message list or a tool's arguments, as JSON text
            try:
                call["prompt"] = json.loads(call.get("prompt"))
            except (TypeError, ValueError, RecursionError):
                self._send_answer(call, {"error": "the call's prompt is not JSON"})
                return
        if calls is None:
            self._send_answer(call, {"error": "no llm_query handler: pass on_llm_query"})
        else:
            self._dispatcher.dispatch(calls, call)

    def _send_answer(self, call: Dict[str, Any], fields: Dict[str, Any]) -> None:
        wire, head = self._wire, {"op": "llm_answer", "id": call.get("id")}
        if "value" in fields:  # a tool's answer crosses as the JSON text of its value
            try:
                fields = {"text": json.dumps(fields["value"], ensure_ascii=False,
                                             allow_nan=False)}
            except (TypeError, ValueError, RecursionError) as error:
                fields = unencodable(call, error)
        try:
            try:
                wire.send({**head, **fields})
            except (TypeError, ValueError, RecursionError) as error:  # not JSON, or too large
                wire.send({**head, **unencodable(call, error)})
        except (RlmSandboxError, ValueError):
            pass  # the session ended: the cell sees an error
