"""The fields of the requests both clients send (``rlm-sandbox repl`` lines and ``serve``
frames take the same ones): an execute's, and the durations they carry."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Union

from .result import CellResult, RlmSandboxError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def milliseconds(value: Union[int, float, str], what: str) -> int:
    """Seconds (a number) or a duration string ("30s", "500ms", "2m") -> milliseconds."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{what} {value!r}: expected e.g. 30s, 500ms, 2m")
        scale = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1}[match.group(2)]
        result = float(match.group(1)) * scale
    elif isinstance(value, bool) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    else:
        result = value * 1000
    return max(1, round(result))


def execute_request(code: str, timeout: Optional[Union[int, float, str]], locals: bool,
                    fetch: Optional[str]) -> Dict[str, Any]:
    """An ``execute``: the code, a time limit (seconds or "30s"), and what the result lists."""
    request: Dict[str, Any] = {"op": "execute", "code": code}
    if timeout is not None:
        request["timeout_ms"] = milliseconds(timeout, "timeout")
    if locals:
        request["locals"] = True
    if fetch is not None:
        if not isinstance(fetch, str):
            raise TypeError(f"fetch must be a variable name, not {type(fetch).__name__}")
        request["fetch"] = fetch
    return request


def checked_index(index: Any) -> int:
    """An add_context/add_history index as given by the caller."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a non-negative int, not {index!r}")
    return index


def added_index(result: Dict[str, Any]) -> int:
    """The index an add_context/add_history result names; raises when it failed."""
    index = result.get("index")
    if result.get("status") != "ok" or isinstance(index, bool) or not isinstance(index, int):
        raise RlmSandboxError(f"the session did not take it: {result.get('status')}: "
                              f"{result.get('error') or ''}".rstrip(": "))
    return index


def checked_allow(allow: Any) -> List[str]:
    """A narrow_network list as given by the caller: allow entries, each a string (the server
    or the repl checks each against the session's list)."""
    if isinstance(allow, str) or not isinstance(allow, (list, tuple)):
        raise TypeError(f"allow must be a list of allow entries, not {type(allow).__name__}")
    for entry in allow:
        if not isinstance(entry, str):
            raise TypeError(f"each allow entry is a string, not {type(entry).__name__}")
    return list(allow)


def loaded(result: CellResult, path: Union[str, "os.PathLike[str]"]) -> CellResult:
    """A load's result when the session took the state; raises RlmSandboxError (with the
    sandbox's reason) when it could not (``restore_from``, the integrations)."""
    if not result.ok:
        raise RlmSandboxError(f"cannot load the save file '{os.fspath(path)}': {result.status}: "
                              f"{result.error or ''}".rstrip(": "))
    return result
