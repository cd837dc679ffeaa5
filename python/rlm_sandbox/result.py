"""What the client returns and raises: a cell's result, the error, the llm_query callback."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

#: A prompt as the cell gave it: a ``str``, or a list of messages ``{"role", "content"}``.
Prompt = Union[str, List[Dict[str, Any]]]

#: ``callback(prompt, model) -> answer``; ``model`` is ``None`` unless the cell named one, and
#: ``prompt`` is a ``str`` or a list of message dicts, as the cell passed it. Raising an exception
#: fails the call: ``llm_query`` then returns ``"Error: <the exception's text>"`` in the cell.
LlmCallback = Callable[[Prompt, Optional[str]], str]


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

    ``answer`` is ``str(answer["content"])`` when the cell set ``answer["ready"]``, else None;
    ``locals`` (``execute(locals=True)``) lists the cells' variables as ``{"name", "type",
    "repr"}`` dicts; ``fetched`` (``execute(fetch=name)``) is ``{"value": V}`` or ``{"error":
    "..."}``; ``index`` is the slot ``add_context``/``add_history`` filled; ``saved`` (a
    ``save``'s result) is ``{"bytes": the file's size, "skipped": [{"name", "type", "why"}...]}``,
    the variables the file does not hold (generators, open files, sockets...).
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
    answer: Optional[str] = None
    locals: Optional[List[Dict[str, Any]]] = None
    fetched: Optional[Dict[str, Any]] = None
    index: Optional[int] = None
    saved: Optional[Dict[str, Any]] = None
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
            answer=_answer(data.get("answer")),
            locals=data["locals"] if isinstance(data.get("locals"), list) else None,
            fetched=data["fetched"] if isinstance(data.get("fetched"), dict) else None,
            index=data["index"] if _is_int(data.get("index")) else None,
            saved=data["saved"] if isinstance(data.get("saved"), dict) else None,
            raw=dict(data),
        )


def _answer(value: Any) -> Optional[str]:
    """The ``answer`` key of a result: ``{"content": str}`` (or a bare string)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class RunResult:
    """How one run ended (``Result::to_json()``; DESIGN.md §8): ``status`` is ``ok``,
    ``exit_nonzero``, ``signaled``, ``timeout``, ``cpu_limit``, ``memory_limit``, ``pids_limit``,
    ``output_limit``, ``seccomp_violation``, ``sandbox_error``, ``interrupted`` (the caller
    stopped it) or ``node_drained`` (the server was drained and the run outlived the drain's
    grace). Through a server, ``stdout`` and ``stderr`` are what this client read from its
    own pipes, capped at the policy's ``limits.output_bytes`` per stream, and ``node`` names
    the node that ran it (the server's ``--node-id``; empty for a direct run)."""

    status: str
    exit_code: int = 0
    signal: int = 0
    detail: str = ""
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    peak_memory_bytes: int = 0
    backend: str = ""
    policy: str = ""
    node: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "RunResult":
        return cls(
            status=str(data.get("status", "sandbox_error")),
            exit_code=int(data.get("exit_code") or 0),
            signal=int(data.get("signal") or 0),
            detail=str(data.get("detail") or ""),
            stdout=data.get("stdout") or "",
            stderr=data.get("stderr") or "",
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            wall_ms=float(data.get("wall_ms") or 0.0),
            cpu_ms=float(data.get("cpu_ms") or 0.0),
            peak_memory_bytes=int(data.get("peak_memory_bytes") or 0),
            backend=str(data.get("backend") or ""),
            policy=str(data.get("policy") or ""),
            node=str(data.get("node") or ""),
            raw=dict(data),
        )
