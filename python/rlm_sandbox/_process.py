"""The ``rlm-sandbox repl`` process: its pipes, the reader thread that answers ``llm_query``
events, and the tail of its stderr.

The pipes are raw file descriptors, read and written with ``os.read``/``os.write``: no buffered
file object (whose lock a daemon thread may hold when the interpreter exits) is ever shared
with a thread. Each reader thread owns its fd and closes it at the end of its stream.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence

from ._calls import Calls, Dispatcher, unencodable
from .result import RlmSandboxError

_log = logging.getLogger(__name__)

_STDERR_KEEP = 64 * 1024  # bytes of the CLI's stderr kept for error messages
_EXIT_WAIT = 10.0  # seconds to wait for the process to exit before killing it
_FINALIZING_WAIT = 5.0  # the same while the interpreter shuts down (nothing else can run)
_LOCK_WAIT = 1.0  # seconds to wait, at shutdown, for a lock a frozen daemon thread may hold
_READ_CHUNK = 1 << 16
#: The longest line taken from the CLI; a longer one is dropped. Its lines carry a cell's
#: output (capped by the policy) and prompts of at most a control-channel frame, JSON-escaped.
_MAX_OUTPUT_LINE = 512 << 20


def _finalizing() -> bool:
    return sys.is_finalizing()


class _StderrTail:
    """Reads an fd to its end on a daemon thread, keeping the last bytes; closes the fd then."""

    def __init__(self, fd: int, keep: int = _STDERR_KEEP) -> None:
        self._fd = fd
        self._keep = keep
        self._chunks: collections.deque = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rlm-sandbox-stderr")
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                chunk = os.read(self._fd, 4096)
                if not chunk:
                    break
                with self._lock:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size > self._keep and len(self._chunks) > 1:
                        self._size -= len(self._chunks.popleft())
        except OSError:
            pass
        finally:
            os.close(self._fd)

    def text(self) -> str:
        if not self._lock.acquire(timeout=_LOCK_WAIT if _finalizing() else -1):
            return ""
        try:
            data = b"".join(self._chunks)
        finally:
            self._lock.release()
        return data.decode("utf-8", "replace")

    def finish(self, timeout: float = 2.0) -> None:
        """Waits for the stream's end (the process has exited)."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


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

    def __init__(self, args: Sequence[str], env: Optional[Dict[str, str]],
                 max_workers: int) -> None:
        # The CLI writes a long text prompt into a file here (--bulk-dir) instead of a JSON
        # line, which Python parses at ~220 MB/s; this process's own, removed with it.
        self._bulk_dir: Optional[str] = tempfile.mkdtemp(prefix="rlm-sandbox-bulk-")
        # Removed at shutdown; this also when the object is collected or the interpreter exits
        # without one (a file the CLI writes after that fails, and the prompt goes inline).
        self._bulk_cleanup = weakref.finalize(self, shutil.rmtree, self._bulk_dir, True)
        #: The command line the process was started with.
        self.args = [*args[:2], "--bulk-dir", self._bulk_dir, *args[2:]]
        to_close: List[int] = []
        try:
            in_read, in_write = os.pipe2(os.O_CLOEXEC)
            to_close += [in_read, in_write]
            out_read, out_write = os.pipe2(os.O_CLOEXEC)
            to_close += [out_read, out_write]
            err_read, err_write = os.pipe2(os.O_CLOEXEC)
            to_close += [err_read, err_write]
            self.proc = subprocess.Popen(self.args, stdin=in_read, stdout=out_write,
                                         stderr=err_write, env=env)
        except BaseException:
            for fd in to_close:
                os.close(fd)
            self._remove_bulk_dir()
            raise
        for fd in (in_read, out_write, err_write):  # the child's ends
            os.close(fd)
        self._stdin = in_write  # -1 once closed (under _write_lock)
        self.replies: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self.stderr = _StderrTail(err_read)
        self._write_lock = threading.Lock()
        self._answers_open = True  # llm_result lines may be sent (not after close)
        self._state_lock = threading.Lock()
        self._current_id: Optional[int] = None  # the execute whose queries are answered
        self._calls: Optional[Calls] = None
        self.dispatcher = Dispatcher(max_workers, self._send_answer)
        self._reader = threading.Thread(target=self._read, args=(out_read,), daemon=True,
                                        name="rlm-sandbox-reader")
        self._reader.start()

    def expect_queries(self, request_id: Optional[int], calls: Optional[Calls]) -> None:
        """Sets the request whose llm_query events `calls` answers (None: refuse them all)."""
        with self._state_lock:
            self._current_id = request_id
            self._calls = calls

    def write(self, data: bytes, answer: bool = False) -> None:
        """Writes one line; raises RlmSandboxError when the pipe is gone."""
        with self._write_lock:
            if answer and not self._answers_open:
                return
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if self._stdin < 0:
                raise BrokenPipeError("stdin is closed")
            while view:
                view = view[os.write(self._stdin, view):]
        except OSError as error:  # BrokenPipe, or stdin already closed
            raise RlmSandboxError(f"cannot write to rlm-sandbox repl: {error}") from error

    def stop_answers(self) -> None:
        """No llm_result line is written from now on (one is never cut in half)."""
        with self._write_lock:
            self._answers_open = False

    def _read(self, fd: int) -> None:
        parts: List[bytes] = []  # the line read so far
        size = 0
        dropping = False  # within a line over _MAX_OUTPUT_LINE
        try:
            while True:
                chunk = os.read(fd, _READ_CHUNK if size < _READ_CHUNK else 1 << 20)
                if not chunk:
                    break
                start = 0
                while True:
                    end = chunk.find(b"\n", start)
                    if end < 0:
                        if not dropping and start < len(chunk):
                            parts.append(chunk[start:])
                            size += len(chunk) - start
                            if size > _MAX_OUTPUT_LINE:
                                _log.warning("rlm-sandbox repl: a line over %d bytes dropped",
                                             _MAX_OUTPUT_LINE)
                                parts, size, dropping = [], 0, True
                        break
                    if dropping:
                        dropping = False
                    else:
                        line = chunk[start:end]
                        if parts:
                            parts.append(line)
                            line = b"".join(parts)
                            parts, size = [], 0
                        self._on_line(line)
                    start = end + 1
        except OSError:
            pass
        finally:
            os.close(fd)
            self.replies.put(None)  # the end of the output

    def _on_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            _log.warning("rlm-sandbox repl: not JSON: %r", line[:200])
            return
        if not isinstance(message, dict):
            return
        if message.get("event") == "llm_query":
            if "prompt_file" in message:
                message["prompt"] = self._bulk_prompt(message.pop("prompt_file"))
            self._on_query(message)
        else:
            self.replies.put(message)

    def _bulk_prompt(self, path: Any) -> str:
        """The text of a prompt the CLI wrote into the bulk directory (then removed); only a
        file directly in that directory is read."""
        directory = self._bulk_dir
        if not isinstance(path, str) or directory is None or \
                os.path.dirname(path) != directory:
            return ""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            os.unlink(path)
            with os.fdopen(fd, "rb") as prompt:
                data = prompt.read()
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")

    def _remove_bulk_dir(self) -> None:
        self._bulk_dir = None
        self._bulk_cleanup()

    def _on_query(self, event: Dict[str, Any]) -> None:
        with self._state_lock:
            current = event.get("id") is not None and event.get("id") == self._current_id
            calls = self._calls
        if not current or calls is None:
            # Queued behind --llm-concurrency when its cell ended: nobody waits for it.
            self._send_answer(event, {"error": "the cell that asked has ended"})
        else:
            self.dispatcher.dispatch(calls, event)

    def _send_answer(self, event: Dict[str, Any], fields: Dict[str, Any]) -> None:
        head = {"op": "llm_result", "query_id": event.get("query_id")}
        try:
            line = _encode({**head, **fields})
        except (TypeError, ValueError, RecursionError) as error:
            line = _encode({**head, **unencodable(event, error)})
        if len(line) > MAX_LINE_BYTES:
            line = _encode({**head, "error": f"the answer is {len(line)} bytes as a JSON line; "
                            f"rlm-sandbox repl takes at most {MAX_LINE_BYTES}"})
        try:
            self.write(line, answer=True)
        except RlmSandboxError:
            pass  # the process ended; the request waiting on it reports that

    def _close_stdin(self) -> None:
        """Closes stdin (the CLI sees end of input) between two lines, never inside one."""
        finalizing = _finalizing()
        # At shutdown a frozen daemon thread may hold the lock: close regardless then.
        locked = self._write_lock.acquire(timeout=_LOCK_WAIT if finalizing else -1)
        try:
            self._answers_open = False
            if self._stdin >= 0:
                fd, self._stdin = self._stdin, -1
                os.close(fd)
        finally:
            if locked:
                self._write_lock.release()

    def _wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def shutdown(self, wait_first: bool = False, wait: float = _EXIT_WAIT) -> None:
        """Closes stdin, waits for the process (killing it after `wait` seconds), stops the
        threads.

        After a close request the CLI exits by itself: ``wait_first`` keeps its stdin open
        until then, because end-of-input arriving while it exits can crash it (its detached
        reader thread outlives the objects it uses and aborts with std::system_error).
        While the interpreter shuts down no other thread runs: nothing waits for them then.
        """
        finalizing = _finalizing()
        if finalizing:
            wait = min(wait, _FINALIZING_WAIT)
        if wait_first:
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self._close_stdin()
        self._wait(wait)
        self._remove_bulk_dir()  # the process has ended: no file of it can come any more
        if finalizing:
            return
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=2.0)
        self.stderr.finish()
        self.dispatcher.shutdown()

    def abandon(self, wait: Optional[float] = None) -> None:
        """Ends the process through the end of its input (the CLI then closes its session),
        killing it after `wait` seconds."""
        self.shutdown(wait=_EXIT_WAIT if wait is None else wait)

    def kill(self) -> None:
        """Kills the process at once (the sandbox goes with it) and cleans up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.shutdown()
