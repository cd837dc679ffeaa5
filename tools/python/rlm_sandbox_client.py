r"""A small client for ``rlm-sandbox repl``: a persistent, sandboxed Python REPL for RLMs.

Stdlib only (Python 3.9+). Copy this file next to your orchestrator, or put ``tools/python`` on
``PYTHONPATH``. The client starts ``rlm-sandbox repl`` and talks to it in JSON lines over the
process's stdin/stdout (DESIGN.md §6 and §8); the sandbox's ``llm_query`` calls come back to
your Python callback.

Inside the sandbox every cell sees ``context``, ``llm_query(prompt, model=None)``,
``llm_query_batched(prompts, model=None)``, ``FINAL(value)``, ``FINAL_VAR(name)`` and
``SHOW_VARS()``; variables persist from cell to cell, and a cell that times out or hits a limit
is rolled back to the state before it.

A minimal RLM loop (``ask_model(messages) -> str`` is your LM call)::

    import re
    from rlm_sandbox_client import RlmSandbox

    def rlm_loop(question, document, ask_model, max_turns=10):
        def sub_query(prompt, model):            # llm_query() inside the sandbox
            return ask_model([{"role": "user", "content": prompt}])

        messages = [
            {"role": "system", "content": "A Python REPL holds the document in `context`. "
             "Reply with ```python``` blocks; call llm_query(prompt) on chunks; "
             "finish with FINAL(answer) or FINAL_VAR(name)."},
            {"role": "user", "content": question},
        ]
        with RlmSandbox(context=document, on_llm_query=sub_query, timeout=30) as sb:
            for _ in range(max_turns):
                reply = ask_model(messages)
                messages.append({"role": "assistant", "content": reply})
                for code in re.findall(r"```python\n(.*?)```", reply, re.S):
                    cell = sb.execute(code)
                    if cell.has_final:
                        return cell.final
                    messages.append({"role": "user", "content":
                                     f"[{cell.status}]\n{cell.stdout[-4000:]}"
                                     f"{cell.error or ''}"})
        return None

Start-up: the process is started in ``__init__``, which returns once the sandbox is up (or
raises :class:`RlmSandboxError` with the CLI's own message). ``rlm-sandbox repl`` opens the
sandbox only when it reads its first request (that line may carry the context), so the
constructor sends an empty ``execute`` cell to get the ``ready`` event.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import json
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Union

__all__ = ["MAX_LINE_BYTES", "CellResult", "LlmCallback", "RlmSandbox", "RlmSandboxError"]

_log = logging.getLogger(__name__)

#: ``callback(prompt, model) -> answer``; ``model`` is ``None`` unless the cell named one.
#: Raising an exception makes ``llm_query`` raise ``RuntimeError(str(exc))`` in the cell.
LlmCallback = Callable[[str, Optional[str]], str]

_STDERR_KEEP = 64 * 1024  # bytes of the CLI's stderr kept for error messages
_EXIT_WAIT = 10.0  # seconds to wait for the process to exit before killing it


class RlmSandboxError(Exception):
    """The sandbox could not do a request, could not start, or ended unexpectedly."""

    def __init__(self, message: str, *, stderr: str = "",
                 exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.exit_code = exit_code


@dataclass
class CellResult:
    """What one ``execute`` did (the ``result`` object of the repl's answer).

    ``status`` is ``ok``, ``error`` (a Python exception; traceback in ``error``), ``timeout``,
    ``memory_limit``, ``crashed`` (those three are rolled back) or ``session_error``.
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    final: Any = None
    has_final: bool = False
    error: Optional[str] = None
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    llm_calls: int = 0
    rolled_back: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the cell ran to its end without an exception."""
        return self.status == "ok"

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "CellResult":
        """Builds a CellResult from the repl's ``result`` object."""
        return cls(
            status=str(data.get("status", "session_error")),
            stdout=data.get("stdout") or "",
            stderr=data.get("stderr") or "",
            final=data.get("final"),
            has_final=bool(data.get("has_final", data.get("final") is not None)),
            error=data.get("error"),
            wall_ms=float(data.get("wall_ms") or 0.0),
            cpu_ms=float(data.get("cpu_ms") or 0.0),
            llm_calls=int(data.get("llm_calls") or 0),
            rolled_back=bool(data.get("rolled_back", False)),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            raw=dict(data),
        )


def _duration_flag(value: Union[int, float, str]) -> str:
    """Seconds (a number) or a CLI duration string ("30s", "500ms") -> a --timeout value."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {value!r}")
    return f"{max(1, round(value * 1000))}ms"


def _size_flag(value: Union[int, str]) -> str:
    """Bytes (an int) or a CLI size string ("256M") -> a --memory value."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"memory must be a positive number of bytes, not {value!r}")
    return str(int(value))


class _StderrTail:
    """Reads a stream to its end on a daemon thread, keeping the last bytes."""

    def __init__(self, stream: Any, keep: int = _STDERR_KEEP) -> None:
        self._stream = stream
        self._keep = keep
        self._chunks: collections.deque = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rlm-sandbox-stderr")
        self._thread.start()

    def _run(self) -> None:
        try:
            for chunk in iter(lambda: self._stream.read1(4096), b""):
                with self._lock:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size > self._keep and len(self._chunks) > 1:
                        self._size -= len(self._chunks.popleft())
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._chunks)
        return data.decode("utf-8", "replace")

    def finish(self, timeout: float = 2.0) -> None:
        """Waits for the stream's end (the process has exited), then closes it."""
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._stream.close()


#: The longest line ``rlm-sandbox repl`` takes (``rlm-sandbox repl --help``); a longer one is
#: dropped with an error that cannot name its id.
MAX_LINE_BYTES = 16 << 20


def _encode(message: Dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"


class _Connection:
    """The repl process, its pipes and its reader thread.

    The reader thread reads every line as it comes: ``llm_query`` events are answered at once
    (so a query of a cell that has already ended is refused at once, freeing the CLI's slot),
    everything else goes to ``replies`` for the request waiting on it. It holds no reference to
    the RlmSandbox, so a forgotten sandbox can still be collected.
    """

    def __init__(self, proc: subprocess.Popen, max_workers: int) -> None:
        self.proc = proc
        self.max_workers = max_workers
        self.replies: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self.stderr = _StderrTail(proc.stderr)
        self._write_lock = threading.Lock()
        self._answers_open = True  # llm_result lines may be sent (not after close)
        self._state_lock = threading.Lock()
        self._current_id: Optional[int] = None  # the execute whose queries are answered
        self._callback: Optional[LlmCallback] = None
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="rlm-sandbox-reader")
        self._reader.start()

    def expect_queries(self, request_id: Optional[int],
                       callback: Optional[LlmCallback]) -> None:
        """Sets the request whose llm_query events go to `callback` (None: refuse them all)."""
        with self._state_lock:
            self._current_id = request_id
            self._callback = callback

    def write(self, data: bytes, answer: bool = False) -> None:
        """Writes one line; raises RlmSandboxError when the pipe is gone."""
        with self._write_lock:
            if answer and not self._answers_open:
                return
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (OSError, ValueError) as error:  # BrokenPipe, or stdin already closed
                raise RlmSandboxError(f"cannot write to rlm-sandbox repl: {error}") from error

    def stop_answers(self) -> None:
        """No llm_result line is written from now on (one is never cut in half)."""
        with self._write_lock:
            self._answers_open = False

    def _read(self) -> None:
        try:
            for line in iter(self.proc.stdout.readline, b""):
                try:
                    message = json.loads(line)
                except ValueError:
                    _log.warning("rlm-sandbox repl: not JSON: %r", line[:200])
                    continue
                if not isinstance(message, dict):
                    continue
                if message.get("event") == "llm_query":
                    self._on_query(message)
                else:
                    self.replies.put(message)
        except (OSError, ValueError):
            pass
        finally:
            self.replies.put(None)  # the end of the output

    def _on_query(self, event: Dict[str, Any]) -> None:
        query_id = event.get("query_id")
        with self._state_lock:
            current = event.get("id") is not None and event.get("id") == self._current_id
            callback = self._callback
        if not current:
            # Queued behind --llm-concurrency when its cell ended: nobody waits for it.
            self._send_answer(query_id, None, "the cell that asked has ended")
        elif callback is None:
            self._send_answer(query_id, None,
                              "no on_llm_query callback was given to the rlm-sandbox client")
        elif self.max_workers == 1:
            self._run_callback(callback, query_id, event.get("prompt"), event.get("model"))
        else:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="rlm-sandbox-llm")
            try:
                self._executor.submit(self._run_callback, callback, query_id,
                                      event.get("prompt"), event.get("model"))
            except RuntimeError:  # the pool was shut down: the session is ending
                pass

    def _run_callback(self, callback: LlmCallback, query_id: Any, prompt: str,
                      model: Optional[str]) -> None:
        try:
            text = callback(prompt, model)
            if not isinstance(text, str):
                raise TypeError(f"on_llm_query returned {type(text).__name__}, not str")
        except Exception as error:  # noqa: BLE001 - the cell gets it as RuntimeError
            self._send_answer(query_id, None, str(error) or type(error).__name__)
        else:
            self._send_answer(query_id, text, None)

    def _send_answer(self, query_id: Any, text: Optional[str], error: Optional[str]) -> None:
        reply: Dict[str, Any] = {"op": "llm_result", "query_id": query_id}
        if error is None:
            reply["text"] = text
        else:
            reply["error"] = error
        try:
            self.write(_encode(reply), answer=True)
        except RlmSandboxError:
            pass  # the process ended; the request waiting on it reports that

    def shutdown(self, wait_first: bool = False) -> None:
        """Closes stdin, waits for the process (killing it after a while), stops the threads.

        After a close request the CLI exits by itself: ``wait_first`` keeps its stdin open
        until then, because end-of-input arriving while it exits can crash it (its detached
        reader thread outlives the objects it uses and aborts with std::system_error).
        """
        proc = self.proc
        if wait_first:
            try:
                proc.wait(timeout=_EXIT_WAIT)
            except subprocess.TimeoutExpired:
                pass
        with self._write_lock:  # not in the middle of an answer
            self._answers_open = False
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=2.0)
        if not self._reader.is_alive():
            proc.stdout.close()
        self.stderr.finish()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def kill(self) -> None:
        """Kills the process at once (the sandbox goes with it) and cleans up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.shutdown()


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
        extra_args: more ``rlm-sandbox repl`` options, e.g. ``("--llm-concurrency", "16")``.
        on_llm_query: the default ``callback(prompt, model) -> str`` for ``llm_query``.
        max_llm_workers: callbacks run at once on a thread pool (1: one after another, on the
            thread reading the CLI's output).
        context_json: parse ``context_file`` as JSON (``--context-json``).
        env: the process's environment (default: this process's).

    Raises:
        RlmSandboxError: the binary is missing, or the sandbox could not start (the message
            holds the CLI's stderr).

    One request runs at a time (calls from several threads are serialized).
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
        max_llm_workers: int = 8,
        context_json: bool = False,
        env: Optional[Dict[str, str]] = None,
    ) -> None:
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._dead: Optional[RlmSandboxError] = None
        self._close_result: Dict[str, Any] = {}
        self._op_lock = threading.RLock()
        self._ids = itertools.count(1)
        self.on_llm_query = on_llm_query
        #: From the ``ready`` event: the backend and policy the session runs with.
        self.backend: Optional[str] = None
        self.policy: Optional[str] = None

        if context is not None and context_file is not None:
            raise ValueError("give context or context_file, not both")
        binary_path = self._find_binary(binary)
        first_line = None
        spilled: Optional[str] = None
        if context is not None:
            first_line = _encode({"op": "context", "context": context})  # fails early if not JSON
            # The repl takes a line of at most MAX_LINE_BYTES nesting at most 64 deep: a JSON
            # value or a long text goes through a file instead, parsed inside the sandbox.
            if not isinstance(context, str) or context_json or len(first_line) > MAX_LINE_BYTES:
                as_json = not isinstance(context, str) or context_json
                fd, spilled = tempfile.mkstemp(prefix="rlm-sandbox-context-")
                text = (json.dumps(context, ensure_ascii=False, allow_nan=False) if as_json
                        else context)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(text.encode("utf-8"))
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
        args += [str(arg) for arg in extra_args]
        #: The command line the process was started with.
        self.args = args

        try:
            proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env)
        except OSError as error:
            if spilled is not None:
                os.unlink(spilled)
            raise RlmSandboxError(f"cannot run {args[0]}: {error}") from error
        self._conn = _Connection(proc, max(1, int(max_llm_workers)))
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

    # -- public API ---------------------------------------------------------------------------

    @property
    def pid(self) -> Optional[int]:
        """The ``rlm-sandbox repl`` process's id."""
        return self._conn.proc.pid if self._conn else None

    @property
    def running(self) -> bool:
        """True while the repl process runs."""
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
                timeout: Optional[float] = None) -> CellResult:
        """Runs one cell and returns its result.

        Args:
            code: Python source; a final expression's repr is printed, as in a notebook.
            on_llm_query: answers this cell's ``llm_query`` calls (default: the constructor's).
            timeout: this cell's time limit in seconds (may only tighten the policy's).

        Raises:
            RlmSandboxError: the request was refused (e.g. a timeout above the policy's), or
                the process ended.
        """
        request: Dict[str, Any] = {"op": "execute", "code": code}
        if timeout is not None:
            if isinstance(timeout, bool) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
            request["timeout_ms"] = max(1, round(timeout * 1000))
        callback = on_llm_query if on_llm_query is not None else self.on_llm_query
        return CellResult.from_json(self._request(request, callback=callback, answer=True))

    def snapshot(self) -> int:
        """Takes a copy-on-write snapshot of the interpreter; returns its id for restore()."""
        return int(self._request({"op": "snapshot"})["snapshot"])

    def restore(self, snapshot_id: int) -> None:
        """Replaces the interpreter's state with a fresh copy of a snapshot (reusable)."""
        self._request({"op": "restore", "snapshot": int(snapshot_id)})

    def close(self) -> Dict[str, Any]:
        """Ends the session and waits for the process; returns the sandbox's Result dict.

        Idempotent: later calls return the same dict. Returns ``{}`` when the process had
        already ended (after an RlmSandboxError). Raises RlmSandboxError if the close request
        itself fails; the process is gone either way.
        """
        with self._op_lock:
            if self._closed:
                return self._close_result
            self._closed = True
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
        conn = getattr(self, "_conn", None)
        if conn is None or getattr(self, "_closed", True):
            return
        try:
            if conn.proc.poll() is None:
                conn.stop_answers()
                conn.proc.stdin.close()
                conn.proc.wait(timeout=1.0)
        except Exception:  # noqa: BLE001
            pass
        try:
            conn.kill()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self.running else "ended")
        return (f"RlmSandbox(pid={self.pid}, backend={self.backend!r}, policy={self.policy!r},"
                f" {state})")

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _find_binary(binary: Optional[Union[str, os.PathLike]]) -> str:
        if binary is not None:
            return os.fspath(binary)
        from_env = os.environ.get("RLM_SANDBOX_BIN")
        if from_env:
            return from_env
        found = shutil.which("rlm-sandbox")
        if found is None:
            raise RlmSandboxError(
                "rlm-sandbox not found: pass binary=, set RLM_SANDBOX_BIN or put it on PATH")
        return found

    def _request(self, message: Dict[str, Any], *, callback: Optional[LlmCallback] = None,
                 answer: bool = False, allow_closed: bool = False) -> Dict[str, Any]:
        """Sends one request with a fresh id; returns its result (answer: its cell's queries
        go to `callback`)."""
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
            conn.expect_queries(request_id if answer else None, callback)
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

    def _kill(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.kill()
