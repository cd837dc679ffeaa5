"""The host side of a cell's calls: ``llm_query``, ``rlm_query`` and the host's tools.

A call arrives as an ``llm_query`` event (``kind`` ``llm``, ``rlm`` or ``tool``); :class:`Calls`
picks the function that answers it and turns what that function did into the reply's fields:
``{"text": str}`` for an LM call, ``{"value": <JSON>}`` for a tool, ``{"error": str}`` when it
failed (the cell sees ``"Error: ..."`` from ``llm_query``, ``RuntimeError`` from a tool of the
``"json"`` encoding; a ``"python"`` tool's exception is sent as a value and raised as its type).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import keyword
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ._pyvalues import (PYVALUE_MAX_HASHED, PyvalueError, pyvalue_decode, pyvalue_encode,
                        pyvalue_encode_exception)
from .result import LlmCallback

#: Names the REPL defines itself (spec: "Reserved names"); a tool may not take one.
RESERVED_NAMES = frozenset({
    "context", "history", "answer", "llm_query", "llm_query_batched", "rlm_query",
    "rlm_query_batched", "FINAL", "FINAL_VAR", "SHOW_VARS"})
#: At most this many tools per session (as the worker takes them).
MAX_TOOLS = 64

#: Calls that return at once are answered on the thread that read them: a hand-over to the pool
#: costs two thread wake-ups per call, which on a busy machine is most of a batch's time. After
#: _FAST_STREAK calls of one function in a row each took under _FAST_CALL seconds, its calls
#: run on the reading thread; one that takes over _SLOW_CALL sends the next ones back to the pool
#: (so a slow callback delays the reading of other calls by at most one call). Each function
#: (llm_query's, rlm_query's, each tool's) keeps its own count.
_FAST_STREAK = 16
_MAX_STREAKS = 256
_FAST_CALL = 0.0002
_SLOW_CALL = 0.002


def _reserved(name: str) -> bool:
    if name in RESERVED_NAMES:
        return True
    for prefix in ("context_", "history_"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return False


#: How tools' values cross: plain JSON, or ``_pyvalues``'s tags (tuples, sets, bytes, dict
#: order and exception types kept, as LocalREPL's callers see them).
TOOL_ENCODINGS = ("json", "python")


class PythonValuesTool:
    """A callable tool of the ``"python"`` encoding: its arguments are decoded from
    ``_pyvalues``'s tags, its result encoded, and an exception it raises is sent as one, to be
    raised in the cell as its own type (a builtin one, or one of its name on its builtin base)."""

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self.name = name
        self.function = function

    def answer(self, args: Any, kwargs: Any) -> Dict[str, Any]:
        try:  # from the sandbox: hostile, bounded by the frame (depth, values) and here
            budget = [PYVALUE_MAX_HASHED]   # keys whose hashes it could make collide
            args = pyvalue_decode(args, budget=budget)
            kwargs = {key: pyvalue_decode(value, budget=budget) for key, value in kwargs.items()}
        except (PyvalueError, RecursionError) as error:
            return {"error": f"tool {self.name!r}: arguments that are not encoded values "
                             f"({error})"}
        try:
            value = self.function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - raised in the cell as its own type
            return {"value": pyvalue_encode_exception(error)}
        try:
            return {"value": pyvalue_encode(value)}
        except (PyvalueError, RecursionError) as error:
            return {"value": pyvalue_encode_exception(
                TypeError(f"tool {self.name!r} returned {error}"))}


def split_tools(tools: Optional[Mapping[str, Any]], encoding: str = "json"
                ) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The tools as the repl's ``--tools`` list, and the callable ones by name (wrapped in a
    ``PythonValuesTool`` under the ``"python"`` encoding).

    Each entry is a callable (called on the host), any other value (a data tool: the REPL
    global is that value; JSON under the ``"json"`` encoding), or ``{"tool": <either>,
    "description": str}``. Under ``"python"`` a data tool's value that cannot be encoded does
    not fail here: the cell gets a TypeError saying why when it uses the name.
    """
    if encoding not in TOOL_ENCODINGS:
        raise ValueError(f"tool_encoding must be one of {TOOL_ENCODINGS}, not {encoding!r}")
    specs: List[Dict[str, Any]] = []
    functions: Dict[str, Any] = {}
    if not tools:
        return specs, functions
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"{len(tools)} tools; a session takes at most {MAX_TOOLS}")
    for name, entry in tools.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"tool name {name!r} is not a Python identifier")
        if _reserved(name):
            raise ValueError(f"tool name {name!r} is reserved by the REPL")
        description = ""
        if isinstance(entry, dict) and "tool" in entry:
            description = entry.get("description") or ""
            if not isinstance(description, str):
                raise ValueError(f"tool {name!r}: the description must be a str")
            entry = entry["tool"]
        spec: Dict[str, Any] = {"name": name}
        if description:
            spec["description"] = description
        if encoding == "python":
            spec["encoding"] = "python"
        if callable(entry):
            functions[name] = PythonValuesTool(name, entry) if encoding == "python" else entry
        elif encoding == "python":
            try:
                spec["value"] = pyvalue_encode(entry)
            except (PyvalueError, RecursionError) as error:
                spec["value"] = {"u": str(error)}
        else:
            spec["value"] = entry
        specs.append(spec)
    return specs, functions


#: The host's id of the call being answered in this context (see ``current_call_id``).
_CURRENT_CALL: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar(
    "rlm_sandbox_current_call", default=None)


def current_call_id() -> Optional[int]:
    """In a callback answering a call, the id the host gave the call (a repl event's
    ``query_id``, a server's call ``id``): ids grow in the order the cell made its calls, a
    batch's in prompt order, whatever order the callbacks run in. None elsewhere."""
    return _CURRENT_CALL.get()


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


class Calls:
    """Who answers one request's calls: ``llm`` (``llm_query``), ``rlm`` (``rlm_query``;
    default ``llm``) and the callable ``tools``."""

    def __init__(self, llm: Optional[LlmCallback], rlm: Optional[LlmCallback] = None,
                 tools: Optional[Mapping[str, Callable[..., Any]]] = None) -> None:
        self.llm = llm
        self.rlm = rlm if rlm is not None else llm
        self.tools = dict(tools or {})

    def answerer(self, event: Mapping[str, Any]) -> Tuple[str, Any, Optional[Callable[..., Any]]]:
        """(kind, tool name, the function that answers the call event, or None)."""
        kind = event.get("kind") or "llm"
        if kind == "tool":
            name = event.get("tool")
            if not isinstance(name, str):
                return kind, None, None
            return kind, name, self.tools.get(name)
        return kind, None, self.rlm if kind == "rlm" else self.llm

    def answer(self, event: Mapping[str, Any]) -> Dict[str, Any]:
        """The reply's fields for one call event; never raises for what a callback does."""
        call_id = event.get("query_id", event.get("id"))
        token = _CURRENT_CALL.set(call_id if isinstance(call_id, int) else None)
        try:
            return self._answer(event)
        finally:
            _CURRENT_CALL.reset(token)

    def _answer(self, event: Mapping[str, Any]) -> Dict[str, Any]:
        kind, name, callback = self.answerer(event)
        if kind == "tool":
            return self._tool(name, callback, event.get("prompt"))
        if callback is None:
            what = "on_rlm_query or on_llm_query" if kind == "rlm" else "on_llm_query"
            return {"error": f"no {what} callback was given to the rlm-sandbox client"}
        try:
            text = callback(event.get("prompt"), event.get("model"))
            if not isinstance(text, str):
                raise TypeError(f"on_{kind}_query returned {type(text).__name__}, not str")
        except Exception as error:  # noqa: BLE001 - the cell gets it as the call's error
            return {"error": _error_text(error)}
        return {"text": text}

    def _tool(self, name: Any, function: Optional[Callable[..., Any]],
              call: Any) -> Dict[str, Any]:
        if function is None:
            return {"error": f"no host tool named {str(name)[:100]!r}" if name is not None
                    else "a tool call without a tool name"}
        args = call.get("args") if isinstance(call, dict) else None
        kwargs = call.get("kwargs") if isinstance(call, dict) else None
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"error": f"tool {name!r}: the call carried no args/kwargs"}
        if isinstance(function, PythonValuesTool):
            return function.answer(args, kwargs)
        try:
            value = function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the cell gets it as RuntimeError
            return {"error": _error_text(error)}
        return {"value": value}  # the caller's encoder fails it if it is not JSON


def unencodable(event: Mapping[str, Any], error: Exception) -> Dict[str, Any]:
    """The reply's fields when the answer could not be encoded as JSON."""
    if event.get("kind") == "tool":
        what = f"tool {str(event.get('tool'))[:100]!r} returned a value that is not JSON"
    else:
        what = "the answer could not be encoded"
    return {"error": f"{what}: {_error_text(error)}"}


#: ``send(event, fields)``: writes the reply to one call event.
Send = Callable[[Dict[str, Any], Dict[str, Any]], None]


class Dispatcher:
    """Runs the answers to call events, on a pool of `workers` threads, or on the thread that
    read the event (always with one worker; else while calls return at once)."""

    def __init__(self, workers: int, send: Send, name: str = "rlm-sandbox-llm") -> None:
        self.workers = max(1, workers)
        self._send = send
        self._name = name
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        self._closed = False
        # Per answering function, calls in a row that returned within _FAST_CALL.
        self._streaks: Dict[Tuple[str, Any, int], int] = {}

    def fast(self, key: Tuple[str, Any, int]) -> bool:
        """True when the calls of `key` (``Calls.answerer`` with the function's id) are answered
        on the reading thread."""
        return self._streaks.get(key, 0) >= _FAST_STREAK

    def dispatch(self, calls: Calls, event: Dict[str, Any]) -> None:
        """Answers one call event (dropped once shut down)."""
        if self._closed:
            return
        kind, name, function = calls.answerer(event)
        key = (kind, name, id(function))
        if self.workers == 1 or self.fast(key):
            self._answer(calls, event, key)
            return
        with self._pool_lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix=self._name)
            pool = self._pool
        try:
            pool.submit(self._answer, calls, event, key)
        except RuntimeError:  # the pool was shut down: the session is ending
            pass

    def _answer(self, calls: Calls, event: Dict[str, Any], key: Tuple[str, Any, int]) -> None:
        start = time.perf_counter()
        fields = calls.answer(event)
        took = time.perf_counter() - start
        # Updated from several threads without a lock: a lost update only moves a switch.
        streak = self._streaks.get(key, 0)
        if took < _FAST_CALL:
            if len(self._streaks) >= _MAX_STREAKS and key not in self._streaks:
                self._streaks.clear()  # per-cell callbacks: forget the old ones
            self._streaks[key] = min(streak + 1, _FAST_STREAK)
        elif took > _SLOW_CALL or streak < _FAST_STREAK:
            self._streaks.pop(key, None)
        self._send(event, fields)

    def shutdown(self) -> None:
        """Later calls are dropped; calls not yet started are cancelled (none is waited for)."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
