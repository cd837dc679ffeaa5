"""What the client returns and raises: a cell's result, the error, the llm_query callback."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

#: ``callback(prompt, model) -> answer``; ``model`` is ``None`` unless the cell named one.
#: Raising an exception makes ``llm_query`` raise ``RuntimeError(str(exc))`` in the cell.
LlmCallback = Callable[[str, Optional[str]], str]


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


@dataclass
class RunResult:
    """How one run ended (``Result::to_json()``; DESIGN.md §8): ``status`` is ``ok``,
    ``exit_nonzero``, ``signaled``, ``timeout``, ``cpu_limit``, ``memory_limit``, ``pids_limit``,
    ``output_limit``, ``seccomp_violation`` or ``sandbox_error``. Through a server, ``stdout`` and
    ``stderr`` are what this client read from its own pipes, capped at the policy's
    ``limits.output_bytes`` per stream."""

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
            raw=dict(data),
        )
