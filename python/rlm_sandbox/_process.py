"""The ``rlm-sandbox repl`` process: its pipes, the reader thread that answers ``llm_query``
events, and the tail of its stderr."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import queue
import subprocess
import threading
from typing import Any, Dict, Optional

from .result import LlmCallback, RlmSandboxError

_log = logging.getLogger(__name__)

_STDERR_KEEP = 64 * 1024  # bytes of the CLI's stderr kept for error messages
_EXIT_WAIT = 10.0  # seconds to wait for the process to exit before killing it


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
