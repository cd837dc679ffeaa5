"""The fields of the requests both clients send (``rlm-sandbox repl`` lines and ``serve``
frames take the same ones): an execute's, and the durations they carry."""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Union

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
