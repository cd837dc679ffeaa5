"""The host side of a cell's calls: ``llm_query``, ``rlm_query`` and the host's tools.

A call arrives as an ``llm_query`` event (``kind`` ``llm``, ``rlm`` or ``tool``); :class:`Calls`
picks the function that answers it and turns what that function did into the reply's fields:
``{"text": str}`` for an LM call, ``{"value": <JSON>}`` for a tool, ``{"error": str}`` when it
failed (the cell sees ``"Error: ..."`` from ``llm_query``, ``RuntimeError`` from a tool).
"""

from __future__ import annotations

import keyword
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .result import LlmCallback

#: Names the REPL defines itself (spec: "Reserved names"); a tool may not take one.
RESERVED_NAMES = frozenset({
    "context", "history", "answer", "llm_query", "llm_query_batched", "rlm_query",
    "rlm_query_batched", "FINAL", "FINAL_VAR", "SHOW_VARS"})
#: At most this many tools per session (as the worker takes them).
MAX_TOOLS = 64


def _reserved(name: str) -> bool:
    if name in RESERVED_NAMES:
        return True
    for prefix in ("context_", "history_"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return False


def split_tools(tools: Optional[Mapping[str, Any]]
                ) -> Tuple[List[Dict[str, Any]], Dict[str, Callable[..., Any]]]:
    """The tools as the repl's ``--tools`` list, and the callable ones by name.

    Each entry is a callable (called on the host), any other JSON value (a data tool: the
    REPL global is that value), or ``{"tool": <either>, "description": str}``.
    """
    specs: List[Dict[str, Any]] = []
    functions: Dict[str, Callable[..., Any]] = {}
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
        if callable(entry):
            functions[name] = entry
        else:
            spec["value"] = entry
        specs.append(spec)
    return specs, functions


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

    def answer(self, event: Mapping[str, Any]) -> Dict[str, Any]:
        """The reply's fields for one call event; never raises for what a callback does."""
        kind = event.get("kind") or "llm"
        if kind == "tool":
            return self._tool(event.get("tool"), event.get("prompt"))
        callback = self.rlm if kind == "rlm" else self.llm
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

    def _tool(self, name: Any, call: Any) -> Dict[str, Any]:
        function = self.tools.get(name) if isinstance(name, str) else None
        if function is None:
            return {"error": f"no host tool named {str(name)[:100]!r}"}
        args = call.get("args") if isinstance(call, dict) else None
        kwargs = call.get("kwargs") if isinstance(call, dict) else None
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"error": f"tool {name!r}: the call carried no args/kwargs"}
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
