"""RlmSandbox: one ``rlm-sandbox repl`` process, a persistent sandboxed Python session."""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from ._calls import Calls, split_tools
from ._fork import BranchOptions, checked_count, fork_branches
from ._process import _EXIT_WAIT, MAX_LINE_BYTES, _Connection, _encode, _finalizing
from ._requests import added_index, checked_allow, checked_index, execute_request, loaded
from .result import CellResult, LlmCallback, RlmSandboxError
from .server import ServerSession, server_from_environment

_log = logging.getLogger(__name__)

#: A text context above this many bytes goes to the repl through a temporary file (read on the
#: host by the CLI, as ``--context`` is), not JSON-escaped into a line; a JSON one and a history
#: always do (parsed in the sandbox, dicts keep their key order).
_INLINE_BYTES = 1 << 20
#: Linux's bound on one command-line argument (MAX_ARG_STRLEN), which --tools must fit in.
_MAX_ARG_BYTES = 128 * 1024


def _duration_flag(value: Union[int, float, str], what: str = "timeout") -> str:
    """Seconds (a number) or a CLI duration string ("30s", "500ms") -> a --timeout value."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return f"{max(1, round(value * 1000))}ms"


def _size_flag(value: Union[int, str]) -> str:
    """Bytes (an int) or a CLI size string ("256M") -> a --memory value."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"memory must be a positive number of bytes, not {value!r}")
    return f"{int(value)}B"  # the CLI takes no bare size


def _count_flag(value: int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, not {value!r}")
    return str(value)


def _tools_flag(specs: List[Dict[str, Any]]) -> str:
    """The --tools JSON; raises ValueError when it cannot be one command-line argument."""
    text = json.dumps(specs, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    if len(text.encode("utf-8")) >= _MAX_ARG_BYTES:
        raise ValueError(f"the tools are {len(text)} characters as --tools JSON; a command-line "
                         f"argument holds less than {_MAX_ARG_BYTES} bytes: pass large data "
                         f"with add_context")
    return text


def _spill(data: bytes) -> str:
    """A private temporary file holding `data`; the caller removes it."""
    fd, path = tempfile.mkstemp(prefix="rlm-sandbox-context-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


#: Sandboxes still open, closed when the interpreter exits (before it stops its threads).
_open_sandboxes: "weakref.WeakSet[RlmSandbox]" = weakref.WeakSet()


@atexit.register
def _close_open_sandboxes() -> None:
    for sandbox in list(_open_sandboxes):
        sandbox._close_at_exit()


def _installed_binary() -> Optional[str]:
    """rlm-sandbox in an install prefix when it is not on PATH (a service's or cron's short PATH):
    the prefix this package was installed under (PREFIX/lib/python3/dist-packages/rlm_sandbox,
    the .deb's), the running Python's prefix (a virtualenv), then /usr/local and /usr."""
    here = os.path.dirname(os.path.abspath(__file__))
    prefixes = [os.path.normpath(os.path.join(here, os.pardir, os.pardir, os.pardir, os.pardir)),
                sys.prefix, "/usr/local", "/usr"]
    for prefix in prefixes:
        candidate = os.path.join(prefix, "bin", "rlm-sandbox")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class RlmSandbox:
    """One ``rlm-sandbox repl`` process: a persistent sandboxed Python session.

    Args:
        policy: a shipped policy name or a policy JSON file.
        backend: ``auto``, ``namespace`` or ``local``.
        context: the REPL's ``context`` global: a ``str`` is text; any other JSON-able value is
            sent as JSON (the cell sees the parsed value). A JSON value, or a text too long
            for one line (``MAX_LINE_BYTES``), goes through a temporary file, removed once the
            session has started.
        context_file: a host file whose text becomes ``context`` (``--context``).
        lm: who answers ``llm_query`` on the CLI side (``echo``, ``command:CMD``,
            ``http:URL``); default ``None``: this client, through ``on_llm_query``.
        timeout: each cell's default time limit, in seconds or as a CLI duration ("30s").
        memory: the session's memory limit, in bytes or as a CLI size ("256M").
        binary: the ``rlm-sandbox`` executable; default ``$RLM_SANDBOX_BIN``, else ``PATH``.
        extra_args: more ``rlm-sandbox repl`` options.
        on_llm_query: the default ``callback(prompt, model) -> str`` for ``llm_query``; the
            prompt is a ``str`` or a list of message dicts, as the cell passed it.
        on_rlm_query: the same for ``rlm_query`` (a sub-RLM); default: ``on_llm_query``.
        tools: host tools by name, each a REPL global: a callable (the cell's call runs it
            here with the cell's JSON arguments; it returns a JSON value, or raises and the
            cell gets ``RuntimeError``), any other JSON value (the global is that value), or
            ``{"tool": <either>, "description": str}``.
        tool_encoding: how tools' arguments, results and values cross: ``"json"`` (plain
            JSON, as above) or ``"python"`` (tuples, sets, bytes, dict order and non-str keys
            kept, and an exception a tool raises is raised in the cell as its own type;
            ``_pyvalues.py``). The RLM integration uses ``"python"``.
        echo: print the repr of a cell's trailing expression (False: never, ``--no-echo``).
        llm_timeout: seconds (or "10m") an LM or tool call may take (``--llm-timeout``).
        llm_budget: calls allowed per session (``--llm-budget``).
        llm_concurrency: calls answered at once (``--llm-concurrency``).
        max_llm_workers: callbacks run at once on a thread pool (1: one after another, on the
            thread reading the CLI's output); default ``llm_concurrency``, else 16.
        context_json: parse ``context_file`` as JSON (``--context-json``).
        env: the process's environment (default: this process's).
        server: a ``rlm-sandbox serve`` socket: the session comes from that server's warm
            sessions, over the socket, with no process started here (``ServerSession``).
            Default ``$RLM_SANDBOX_SERVER`` when set; ``False``: never a server. With a server,
            ``backend`` must be ``auto``, and ``lm``, ``binary``, ``extra_args``, ``env`` are
            refused (they configure a local process); the server never runs elsewhere.

    Raises:
        RlmSandboxError: the binary is missing, or the sandbox could not start (the message
            holds the CLI's stderr).

    One request runs at a time (calls from several threads are serialized). A sandbox still
    open when the interpreter exits is closed then.
    """

    def __init__(
        self,
        policy: str = "python-repl",
        backend: str = "auto",
        context: Any = None,
        context_file: Optional[Union[str, os.PathLike]] = None,
        lm: Optional[str] = None,
        timeout: Optional[Union[int, float, str]] = None,
        memory: Optional[Union[int, str]] = None,
        binary: Optional[Union[str, os.PathLike]] = None,
        extra_args: Iterable[str] = (),
        *,
        on_llm_query: Optional[LlmCallback] = None,
        on_rlm_query: Optional[LlmCallback] = None,
        tools: Optional[Mapping[str, Any]] = None,
        tool_encoding: str = "json",
        echo: bool = True,
        llm_timeout: Optional[Union[int, float, str]] = None,
        llm_budget: Optional[int] = None,
        llm_concurrency: Optional[int] = None,
        max_llm_workers: Optional[int] = None,
        context_json: bool = False,
        env: Optional[Dict[str, str]] = None,
        server: Union[str, os.PathLike, bool, None] = None,
    ) -> None:
        self._start_fields(on_llm_query, on_rlm_query)
        tool_specs, self._tool_functions = split_tools(tools, tool_encoding)
        extra_args = tuple(extra_args)
        if server is None:
            server = server_from_environment()
        #: What fork() opens each branch with: these arguments, but no context (a branch takes
        #: its contexts from the parent's state), the binary and the server (or none) resolved;
        #: the callbacks are the parent's at the time of the fork.
        self._fork_args: Dict[str, Any] = dict(
            policy=policy, backend=backend, lm=lm, timeout=timeout, memory=memory,
            binary=binary, extra_args=extra_args, tools=tools, tool_encoding=tool_encoding,
            echo=echo, llm_timeout=llm_timeout, llm_budget=llm_budget,
            llm_concurrency=llm_concurrency, max_llm_workers=max_llm_workers,
            env=None if env is None else dict(env),
            server=os.fspath(server) if server else False)
        if max_llm_workers is None:
            max_llm_workers = llm_concurrency or 16

        if server:
            unsupported = [name for name, given in (
                ("backend", backend != "auto"), ("lm", lm is not None),
                ("binary", binary is not None), ("extra_args", bool(extra_args)),
                ("env", env is not None)) if given]
            if unsupported:
                raise ValueError(f"{', '.join(unsupported)} cannot be combined with a server "
                                 f"(its policy chooses the backend, and this client answers "
                                 f"llm_query)")
            self._remote = ServerSession(
                os.fspath(server), str(policy), context=context, context_file=context_file,
                context_json=context_json, on_llm_query=on_llm_query, on_rlm_query=on_rlm_query,
                tools=tools, tool_encoding=tool_encoding, echo=echo, llm_timeout=llm_timeout,
                llm_budget=llm_budget,
                llm_concurrency=llm_concurrency, max_llm_workers=max_llm_workers,
                timeout=timeout, memory=memory)
            self._closed = True  # nothing of the local process to clean up
            self.backend, self.policy = self._remote.backend, str(policy)
            self.args = []
            return

        if context is not None and context_file is not None:
            raise ValueError("give context or context_file, not both")
        binary_path = self._find_binary(binary)
        self._fork_args["binary"] = binary_path  # a branch loads only what its build saved
        tools_flag = _tools_flag(tool_specs) if tool_specs else None
        first_line = None
        spilled: Optional[str] = None
        if context is not None:
            first_line = _encode({"op": "context", "context": context})  # fails early if not JSON
            # The repl takes a line of at most MAX_LINE_BYTES nesting at most 64 deep: a JSON
            # value or a long text goes through a file instead, parsed inside the sandbox.
            if not isinstance(context, str) or context_json or len(first_line) > MAX_LINE_BYTES:
                as_json = not isinstance(context, str) or context_json
                text = (json.dumps(context, ensure_ascii=False, allow_nan=False) if as_json
                        else context)
                spilled = _spill(text.encode("utf-8"))
                context_file, context_json, first_line = spilled, as_json, None

        args = [binary_path, "repl", "--policy", str(policy),
                "--backend", str(backend)]
        if context_file is not None:
            args += ["--context", os.fspath(context_file)]
        if context_json:
            args.append("--context-json")
        if lm is not None:
            args += ["--lm", lm]
        if timeout is not None:
            args += ["--timeout", _duration_flag(timeout)]
        if memory is not None:
            args += ["--memory", _size_flag(memory)]
        if not echo:
            args.append("--no-echo")
        if tools_flag is not None:
            args += ["--tools", tools_flag]
        if llm_timeout is not None:
            args += ["--llm-timeout", _duration_flag(llm_timeout, "llm_timeout")]
        if llm_budget is not None:
            args += ["--llm-budget", _count_flag(llm_budget, "llm_budget")]
        if llm_concurrency is not None:
            args += ["--llm-concurrency", _count_flag(llm_concurrency, "llm_concurrency")]
        args += [str(arg) for arg in extra_args]
        #: The command line the process was started with (``--bulk-dir`` added by it).
        self.args = args

        try:
            self._conn = _Connection(args, env, max(1, int(max_llm_workers)))
            self.args = self._conn.args
        except OSError as error:
            if spilled is not None:
                os.unlink(spilled)
            raise RlmSandboxError(f"cannot run {args[0]}: {error}") from error
        try:
            if first_line is not None:
                self._conn.write(first_line)
            # The CLI opens the sandbox (and says "ready") only once it has a request.
            start = self._request({"op": "execute", "code": ""})
            if start.get("status") != "ok":
                raise RlmSandboxError(
                    f"the sandbox started but its first cell failed: {start.get('status')}: "
                    f"{start.get('error') or ''}".rstrip(": "), stderr=self.stderr)
        except BaseException:
            self._kill()
            raise
        finally:
            if spilled is not None:  # the session has read it (or will never)
                os.unlink(spilled)
        _open_sandboxes.add(self)

    # -- public API ---------------------------------------------------------------------------

    @property
    def pid(self) -> Optional[int]:
        """The ``rlm-sandbox repl`` process's id."""
        return self._conn.proc.pid if self._conn else None

    @property
    def running(self) -> bool:
        """True while the repl process runs (or the server session is open)."""
        if self._remote is not None:
            return self._remote.running
        return self._conn is not None and self._conn.proc.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        """The repl process's exit status once it has ended (0 after a clean close)."""
        return self._conn.proc.poll() if self._conn else None

    @property
    def stderr(self) -> str:
        """The tail of the CLI's own stderr (not a cell's: that is in CellResult.stderr)."""
        return self._conn.stderr.text() if self._conn else ""

    def execute(self, code: str, on_llm_query: Optional[LlmCallback] = None,
                timeout: Optional[float] = None, *, locals: bool = False,
                fetch: Optional[str] = None) -> CellResult:
        """Runs one cell and returns its result.

        Args:
            code: Python source; a final expression's repr is printed, as in a notebook
                (unless the sandbox was made with ``echo=False``).
            on_llm_query: answers this cell's ``llm_query`` calls (default: the constructor's;
                also ``rlm_query``'s when no ``on_rlm_query`` was given).
            timeout: this cell's time limit in seconds (may only tighten the policy's).
            locals: list the cells' variables in ``CellResult.locals`` (``name``, ``type``,
                ``repr``; at most 1,000, each repr cut to 200 characters).
            fetch: a variable's name: ``CellResult.fetched`` is ``{"value": V}`` (V the value
                if it is JSON, else its repr) or ``{"error": "..."}``, taken after the code ran.

        Raises:
            RlmSandboxError: the request was refused (e.g. a timeout above the policy's), or
                the process ended.
        """
        if self._remote is not None:
            return self._remote.execute(code, on_llm_query, timeout, locals=locals, fetch=fetch)
        request = execute_request(code, timeout, locals, fetch)
        return CellResult.from_json(self._request(request, calls=self._calls(on_llm_query)))

    def add_context(self, value: Any, index: Optional[int] = None) -> int:
        """Adds a context to the live session: ``context_N`` (and ``context`` for N = 0).

        A ``str`` is text; any other JSON-able value arrives parsed. `index` picks N (default:
        the next free one); an existing one is replaced. Returns N. A large context, and any
        JSON one, goes through a temporary file, read by the CLI on this host (no JSON
        escaping; the JSON is parsed in the sandbox, so dicts keep their key order).

        Raises:
            RlmSandboxError: the session could not take it (e.g. it ended).
        """
        if self._remote is not None:
            return self._remote.add_context(value, index)
        as_json = not isinstance(value, str)
        data = (json.dumps(value, ensure_ascii=False, allow_nan=False) if as_json
                else value).encode("utf-8")
        request: Dict[str, Any] = {"op": "add_context"}
        spilled: Optional[str] = None
        # JSON goes through a file too: parsed in the sandbox, its dicts keep their key order
        # (the CLI's parser would sort them, as LocalREPL does not).
        if len(data) > _INLINE_BYTES or as_json:
            spilled = _spill(data)
            request["context_file"] = spilled
        else:
            request["context"] = value
        del data
        if as_json:
            request["json"] = True
        if index is not None:
            request["index"] = checked_index(index)
        try:
            return added_index(self._request(request))
        finally:
            if spilled is not None:
                os.unlink(spilled)

    def add_history(self, messages: List[Dict[str, Any]], index: Optional[int] = None) -> int:
        """Adds a message history to the live session: ``history_N`` (and ``history`` for
        N = 0), a list of ``{"role", "content"}`` dicts. Returns N (as ``add_context``)."""
        if self._remote is not None:
            return self._remote.add_history(messages, index)
        if not isinstance(messages, list):
            raise TypeError(f"messages must be a list, not {type(messages).__name__}")
        # Through a file, parsed in the sandbox: the messages keep their key order.
        spilled = _spill(json.dumps(messages, ensure_ascii=False, allow_nan=False)
                         .encode("utf-8"))
        request: Dict[str, Any] = {"op": "add_history", "history_file": spilled}
        if index is not None:
            request["index"] = checked_index(index)
        try:
            return added_index(self._request(request))
        finally:
            os.unlink(spilled)

    def snapshot(self) -> int:
        """Takes a copy-on-write snapshot of the interpreter; returns its id for restore()."""
        if self._remote is not None:
            return self._remote.snapshot()
        return int(self._request({"op": "snapshot"})["snapshot"])

    def restore(self, snapshot_id: int) -> None:
        """Replaces the interpreter's state with a fresh copy of a snapshot (reusable)."""
        if self._remote is not None:
            return self._remote.restore(snapshot_id)
        self._request({"op": "restore", "snapshot": int(snapshot_id)})

    def save(self, path: Union[str, os.PathLike]) -> CellResult:
        """Saves the session's state to the file `path` (mode 0600), run like a cell: the
        variables (functions and classes the cells defined, by value; modules by name), the
        contexts and histories, the files under the sandbox's ``/tmp`` and its cwd.

        Returns the CellResult; on ``ok``, ``saved`` is ``{"bytes": the file's size,
        "skipped": [{"name", "type", "why"}...]}`` (the variables that could not be kept:
        generators, open files, sockets...). The file appears only once it is complete: a save
        that fails (a status other than ``ok``, or an exception) leaves no partial file and an
        existing file at `path` as it was. ``load`` (here or in any later session with the same
        policy and rlm-sandbox build) takes it back.

        Raises:
            RlmSandboxError: the file could not be written (e.g. no such directory), or the
                session ended.
        """
        if self._remote is not None:
            return self._remote.save(path)
        # The CLI writes the file (a temporary one beside it, renamed once complete).
        request = {"op": "save", "path": os.path.abspath(os.fspath(path))}
        return CellResult.from_json(self._request(request))

    def load(self, path: Union[str, os.PathLike]) -> CellResult:
        """Replaces the session's state (variables, contexts, histories, ``/tmp``, cwd) with the
        one a ``save`` wrote to `path`.

        The file is checked on the host before the sandbox reads any of it (its SHA-256 and
        size, and that this rlm-sandbox build and policy made it). Returns the CellResult:
        ``ok``, or ``error`` with the reason when the sandbox could not read the state (e.g. it
        was saved by another Python); check ``.ok`` (``restore_from`` raises instead).

        Raises:
            RlmSandboxError: the file was refused (changed or damaged, cut short, made under
                another policy or by another build) or cannot be opened; the session goes on
                with its state unchanged.
        """
        if self._remote is not None:
            return self._remote.load(path)
        request = {"op": "load", "path": os.path.abspath(os.fspath(path))}
        return CellResult.from_json(self._request(request))

    @classmethod
    def restore_from(cls, path: Union[str, os.PathLike], *args: Any,
                     **kwargs: Any) -> "RlmSandbox":
        """A new sandbox holding the state saved at `path`: ``RlmSandbox(*args, **kwargs)``
        (the constructor's arguments, ``server=`` included), then ``load(path)``.

        Raises:
            RlmSandboxError: the sandbox could not start, or the file was refused or could not
                be loaded (then the new sandbox is closed first).
        """
        path = os.path.abspath(os.fspath(path))  # as the caller's cwd is now
        sandbox = cls(*args, **kwargs)
        try:
            loaded(sandbox.load(path), path)
        except BaseException:
            try:
                sandbox.close()
            except Exception:  # noqa: BLE001 - the load's error is the one to raise
                sandbox._kill()
            raise
        return sandbox

    def fork(self, n: int) -> List["RlmSandbox"]:
        """`n` new sandboxes (1 to 64), each its own sandbox and session, holding this session's
        state as it is now: its variables, contexts, histories, the files under ``/tmp`` and
        its cwd (what ``save`` keeps; ``saved["skipped"]`` kinds are not carried).

        This session is saved once, into a private temporary directory (removed again on
        every path), and the branches are opened and loaded from that file concurrently, each
        with this sandbox's constructor arguments (policy, backend, limits, binary, tools,
        ``server``, ...) and its current ``on_llm_query``/``on_rlm_query``; the context is not
        sent again: a branch's contexts come from the state. A server session's branches are
        opened on the same server (``ServerSession.fork``). Each branch lives on its own: what
        it does is not seen by this session nor by the other branches, it may outlive this
        one, and Python's ``random`` is seeded anew in each. Close each branch when done.

        Raises:
            ValueError: `n` is not an int from 1 to 64.
            RlmSandboxError: this session could not be saved, or a branch could not be opened
                or loaded (the message names which; every branch opened is closed first).
                This session goes on unchanged either way.
        """
        return self._fork(n, None)

    def _fork(self, n: int, branch_options: BranchOptions) -> List["RlmSandbox"]:
        """fork(), with `branch_options(index)` replacing constructor arguments per branch."""
        checked_count(n)
        if self._remote is not None:
            return [self._adopt(remote) for remote in self._remote._fork(n, branch_options)]

        def open_branch(index: int) -> "RlmSandbox":
            options = {**self._fork_args, "on_llm_query": self.on_llm_query,
                       "on_rlm_query": self.on_rlm_query}
            if branch_options is not None:
                options.update(branch_options(index))
            return type(self)(**options)

        return fork_branches(n, self.save, open_branch, lambda branch, path: branch.load(path),
                             RlmSandbox._dispose)

    def narrow_network(self, allow: List[str]) -> None:
        """Narrows the session's egress allowlist while it runs: from now on only ``allow``
        (policy allow entries such as ``"https://pypi.org"``, each within the list as it is;
        ``[]`` for no network at all). The sandbox's DNS and new connections follow it at once,
        and open connections it no longer lets through are ended. Raises RlmSandboxError when
        the session has no allowlist or an entry would widen it."""
        if self._remote is not None:
            return self._remote.narrow_network(allow)
        self._request({"op": "narrow_network", "allow": checked_allow(allow)})

    def close(self) -> Dict[str, Any]:
        """Ends the session and waits for the process; returns the sandbox's Result dict.

        Idempotent: later calls return the same dict. Returns ``{}`` when the process had
        already ended (after an RlmSandboxError), and when called while the interpreter shuts
        down (then the CLI is told by the end of its input, and killed if it lingers). Raises
        RlmSandboxError if the close request itself fails; the process is gone either way.
        """
        if self._remote is not None:
            return self._remote.close()
        if _finalizing():
            # No other thread runs any more: neither the reader a reply needs nor whoever
            # holds a lock. End the process through its input, bounded.
            self._abandon()
            return self._close_result
        with self._op_lock:
            if self._closed:
                return self._close_result
            self._closed = True
            _open_sandboxes.discard(self)
            graceful = False
            try:
                if self._dead is None and self.running:
                    self._conn.stop_answers()  # no late llm_result may follow the close
                    self._close_result = self._request({"op": "close"}, allow_closed=True)
                    graceful = True
            finally:
                if self._conn is not None:
                    self._conn.shutdown(wait_first=graceful)
            return self._close_result

    def __enter__(self) -> "RlmSandbox":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # do not hide the exception that is propagating
            self.close()
        except Exception:  # noqa: BLE001
            self._kill()

    def __del__(self) -> None:
        # Safety net for a session nobody closed: end-of-input lets the CLI end the session
        # cleanly; a process still running a second later is killed.
        if getattr(self, "_conn", None) is None or getattr(self, "_closed", True):
            return
        if self._owner != os.getpid():
            return
        try:
            self._abandon(wait=1.0)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self.running else "ended")
        return (f"RlmSandbox(pid={self.pid}, backend={self.backend!r}, policy={self.policy!r},"
                f" {state})")

    # -- internals ----------------------------------------------------------------------------

    def _start_fields(self, on_llm_query: Optional[LlmCallback],
                      on_rlm_query: Optional[LlmCallback]) -> None:
        """The fields every RlmSandbox has before its session starts."""
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._dead: Optional[RlmSandboxError] = None
        self._close_result: Dict[str, Any] = {}
        self._op_lock = threading.RLock()
        self._ids = itertools.count(1)
        self._owner = os.getpid()  # a forked child never ends this session by itself
        self.on_llm_query = on_llm_query
        self.on_rlm_query = on_rlm_query
        #: From the ``ready`` event: the backend and policy the session runs with.
        self.backend: Optional[str] = None
        self.policy: Optional[str] = None
        #: The server session this object stands for, when one was asked for.
        self._remote: Optional[ServerSession] = None

    def _adopt(self, remote: ServerSession) -> "RlmSandbox":
        """An object of this class standing for `remote`, a branch of this one's server
        session (as the constructor makes one with ``server=``)."""
        sandbox = type(self).__new__(type(self))
        sandbox._start_fields(remote.on_llm_query, remote.on_rlm_query)
        sandbox._tool_functions = self._tool_functions
        sandbox._fork_args = self._fork_args
        sandbox._remote = remote
        sandbox._closed = True  # nothing of a local process to clean up
        sandbox.backend, sandbox.policy = remote.backend, self.policy
        sandbox.args = []
        return sandbox

    @staticmethod
    def _dispose(sandbox: "RlmSandbox") -> None:
        """Closes `sandbox`, or kills its process when the close fails."""
        try:
            sandbox.close()
        except Exception:  # noqa: BLE001
            sandbox._kill()

    @staticmethod
    def _find_binary(binary: Optional[Union[str, os.PathLike]]) -> str:
        if binary is not None:
            return os.fspath(binary)
        from_env = os.environ.get("RLM_SANDBOX_BIN")
        if from_env:
            return from_env
        found = shutil.which("rlm-sandbox") or _installed_binary()
        if found is None:
            raise RlmSandboxError(
                "rlm-sandbox not found: pass binary=, set RLM_SANDBOX_BIN or put it on PATH")
        return found

    def _calls(self, on_llm_query: Optional[LlmCallback]) -> Calls:
        return Calls(on_llm_query or self.on_llm_query, self.on_rlm_query, self._tool_functions)

    def _request(self, message: Dict[str, Any], *, calls: Optional[Calls] = None,
                 allow_closed: bool = False) -> Dict[str, Any]:
        """Sends one request with a fresh id; returns its result (its cell's queries go to
        `calls`; None: they are refused)."""
        with self._op_lock:
            if self._dead is not None:
                raise self._dead
            if self._closed and not allow_closed:
                raise RlmSandboxError("the session is closed")
            conn = self._conn
            request_id = next(self._ids)
            line = _encode({"id": request_id, **message})
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"the request is {len(line)} bytes as a JSON line; rlm-sandbox "
                                 f"repl takes at most {MAX_LINE_BYTES}")
            conn.expect_queries(request_id if calls is not None else None, calls)
            try:
                try:
                    conn.write(line)
                except RlmSandboxError:
                    raise self._ended() from None
                while True:
                    reply = conn.replies.get()
                    if reply is None:
                        raise self._ended()
                    if reply.get("event") == "ready":
                        self.backend = reply.get("backend")
                        self.policy = reply.get("policy")
                    elif reply.get("id") == request_id and "result" in reply:
                        return reply["result"]
                    elif reply.get("id") == request_id and "error" in reply:
                        raise RlmSandboxError(str(reply["error"]), stderr=self.stderr)
                    elif "error" in reply:
                        # Not about this request (e.g. an answer the CLI no longer wanted).
                        _log.warning("rlm-sandbox repl: %s", reply["error"])
            finally:
                conn.expect_queries(None, None)

    def _ended(self) -> RlmSandboxError:
        """The process closed its output: reap it; an error saying why, with its stderr."""
        conn = self._conn
        try:
            code = conn.proc.wait(timeout=_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            conn.proc.kill()
            code = conn.proc.wait()
        conn.shutdown()
        stderr = self.stderr.strip()
        message = f"rlm-sandbox repl exited with status {code}"
        if stderr:
            message += f": {stderr}"
        self._dead = RlmSandboxError(message, stderr=stderr, exit_code=code)
        return self._dead

    def _close_at_exit(self) -> None:
        """At interpreter exit: a clean close, unless another thread is inside a request."""
        if self._owner != os.getpid():
            return  # a forked child's exit: the session is its parent's
        if not self._op_lock.acquire(blocking=False):
            self._abandon()
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            self._kill()
        finally:
            self._op_lock.release()

    def _abandon(self, wait: Optional[float] = None) -> None:
        """Ends the session without a reply: end of input (the CLI closes the session), then
        a bounded wait, then kill. Takes no lock that another thread may hold."""
        self._closed = True
        _open_sandboxes.discard(self)
        if self._conn is not None:
            self._conn.abandon(wait)

    def _kill(self) -> None:
        self._closed = True
        _open_sandboxes.discard(self)
        if self._conn is not None:
            self._conn.kill()

