r"""A code interpreter for DSPy's ``dspy.RLM`` that runs the model's code in rlm-sandbox.

``RlmSandboxInterpreter`` implements DSPy's ``CodeInterpreter`` protocol (``tools``,
``start()``, ``execute(code, variables)``, ``shutdown()``), in place of its default
Deno/Pyodide ``PythonInterpreter``: the code runs in CPython in a sandboxed, persistent
session (a runaway cell is stopped and rolled back; the session goes on)::

    import dspy
    from rlm_sandbox.integrations.dspy import RlmSandboxInterpreter

    dspy.configure(lm=dspy.LM("openai/gpt-5-mini"))
    rlm = dspy.RLM("context, query -> answer",
                   interpreter_factory=RlmSandboxInterpreter.factory(timeout=60))
    print(rlm(context=open("big.txt").read(), query="Who wrote it?").answer)

What the code sees: the ``variables`` of each ``execute`` as globals; ``SUBMIT(...)`` with the
signature of ``output_fields`` (``SUBMIT(output)`` without them), which ends the cell and makes
``execute`` return ``FinalOutput({name: value, ...})``; every tool in ``tools`` by name,
called here on the host (positional arguments are bound to the tool's parameter names, as in
DSPy); ``llm_query(prompt)`` and ``llm_query_batched(prompts)``, answered by the
``llm_query`` tool DSPy puts in ``tools`` (one call per prompt; a failed call gives the
cell ``"Error: ..."``, as the sandbox's ``llm_query`` does, instead of raising).

Errors: an exception in the code raises ``CodeExecutionError("Type: message")`` (``SyntaxError``
for a syntax error); a cell stopped at its time or memory limit raises
``CodeExecutionError`` too (it was rolled back, the session is intact); a session that ended
raises ``CodeInterpreterError`` and stays ended. Without DSPy installed, ``FinalOutput``,
``CodeInterpreterError`` and ``CodeExecutionError`` are stand-ins with the same behaviour.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import keyword
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import RlmSandbox, RlmSandboxError

try:  # DSPy's own types, when it is installed and importable
    from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError
    from dspy.primitives.code_interpreter import FinalOutput
except Exception:  # noqa: BLE001 - absent, or present without its own dependencies

    class CodeInterpreterError(RuntimeError):  # type: ignore[no-redef]
        """Stand-in for DSPy's: a failure submitted code cannot repair (session ended)."""

    class CodeExecutionError(CodeInterpreterError):  # type: ignore[no-redef]
        """Stand-in for DSPy's: a recoverable error raised by the submitted code."""

    class FinalOutput:  # type: ignore[no-redef]
        """Stand-in for DSPy's: what ``execute`` returns when the code called ``SUBMIT``."""

        def __init__(self, output: Any) -> None:
            self.output = output

        def __repr__(self) -> str:
            return f"FinalOutput({self.output!r})"

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, FinalOutput):
                return NotImplemented
            return self.output == other.output


#: Names the interpreter provides itself (never registered as host tools).
BUILTIN_NAMES = frozenset({"llm_query", "llm_query_batched", "SUBMIT"})

#: A string variable at least this long is sent once, as a context (``context_N`` from
#: ``STASH_INDEX`` on: no size limit of a request line, and the session restores those names
#: after every cell), and re-bound before each cell (strings cannot change in place).
STASH_BYTES = 64 * 1024
STASH_INDEX = 1_000_000

#: The host tool that runs tools added to ``tools`` after the session started.
_LATE_TOOL = "rlm_sandbox_tool_call"

_SUBMITTED = "SUBMIT received: the cell ends here"


def _json_value(value: Any) -> Any:
    """``value`` as JSON data, the way DSPy serializes tool results and variables."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):  # a pydantic model, without importing pydantic
        return _json_value(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_value(dataclasses.asdict(value))
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return _json_value(value._asdict())
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        try:
            return [_json_value(v) for v in sorted(value)]
        except TypeError:
            return [_json_value(v) for v in value]
    raise CodeInterpreterError(f"Unsupported value type: {type(value).__name__}")


def _python_literal(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    text = json.dumps(_json_value(value), ensure_ascii=False)
    return f"__import__('json').loads({text!r})"


def _call_tool(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Calls a DSPy tool: positional arguments become keywords named by its signature."""
    if args:
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        if parameters and all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD)
                              for p in parameters):
            named = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]
            if len(args) > len(named):
                raise TypeError(f"takes {len(named)} positional arguments but "
                                f"{len(args)} were given")
            for name, value in zip(named, args):
                if name in kwargs:
                    raise TypeError(f"got multiple values for argument '{name}'")
                kwargs[name] = value
            args = ()
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result


def _error_message(traceback_text: str) -> Tuple[str, str]:
    """(exception type, message) from the last line of a Python traceback."""
    lines = [line for line in (traceback_text or "").strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "Error"
    match = re.match(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$", last)
    if not match:
        return "Error", last
    return match.group(1).rsplit(".", 1)[-1], (match.group(2) or "")


class RlmSandboxInterpreter:
    """DSPy ``CodeInterpreter`` over an rlm-sandbox session.

    Args:
        tools: host-side tools by name (DSPy's ``RLM`` adds ``llm_query``, ``llm_query_batched``
            and the user's tools to this dict before it starts the interpreter).
        output_fields: ``[{"name": ..., "type"?: ...}]``: the parameters of ``SUBMIT``
            (``dspy.RLM`` sets it from the signature).
        policy, backend, timeout, memory, binary, extra_args, env, server: the sandbox's
            (see ``rlm_sandbox.RlmSandbox``); ``timeout`` is each cell's limit in seconds.
        echo: print a cell's trailing expression, as Pyodide returns it (default True).
        sandbox_options: more ``RlmSandbox`` keyword arguments (``llm_timeout``, ...).
    """

    #: What ``dspy.RLM`` tells the model about this runtime.
    execution_instructions = (
        "Python (CPython) runs in a sandboxed, persistent REPL: variables, functions and imports "
        "persist between executions. The standard library is available (re, json, collections, "
        "math, ...); there is no network. A cell that runs too long is stopped and undone.")

    def __init__(self, tools: Optional[Dict[str, Callable[..., Any]]] = None,
                 output_fields: Optional[List[Dict[str, Any]]] = None, *,
                 policy: str = "python-repl", backend: str = "auto",
                 timeout: Optional[float] = None, memory: Any = None, binary: Any = None,
                 extra_args: Any = (), env: Optional[Dict[str, str]] = None,
                 server: Any = None, echo: bool = True,
                 sandbox_options: Optional[Dict[str, Any]] = None) -> None:
        self.tools: Dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields = output_fields
        self._options: Dict[str, Any] = dict(sandbox_options or {})
        self._options.update(policy=policy, backend=backend, timeout=timeout, memory=memory,
                             binary=binary, extra_args=tuple(extra_args), env=env,
                             server=server, echo=echo)
        self._sandbox: Optional[RlmSandbox] = None
        self._ended = False
        self._tool_names: frozenset = frozenset()
        self._late_tools: frozenset = frozenset()
        self._stashed: Dict[str, Tuple[int, str]] = {}  # name -> (context index, digest)
        self._submission: Optional[Dict[str, Any]] = None

    @classmethod
    def factory(cls, **options: Any) -> Callable[[], "RlmSandboxInterpreter"]:
        """A zero-argument ``interpreter_factory`` for ``dspy.RLM`` (one session per call).

        It carries ``execution_instructions``, which ``dspy.RLM`` reads from the factory to
        tell the model about the runtime (a plain ``lambda`` would not).
        """
        def make() -> "RlmSandboxInterpreter":
            return cls(**options)

        make.execution_instructions = cls.execution_instructions  # type: ignore[attr-defined]
        return make

    # -- CodeInterpreter ------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the sandbox session (idempotent; an ended session is not restarted)."""
        if self._ended:
            raise CodeInterpreterError("the interpreter was shut down or its session ended; "
                                       "create a new interpreter for a fresh session")
        if self._sandbox is not None:
            return
        names = frozenset(name for name in self.tools if name not in BUILTIN_NAMES)
        for name in names:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise CodeInterpreterError(f"Invalid tool name: '{name}'")
        host_tools: Dict[str, Any] = {name: self._host_tool(name) for name in names}
        host_tools["SUBMIT"] = {"tool": self._submit,
                                "description": "submit the final output; ends the cell"}
        host_tools[_LATE_TOOL] = self._late_tool_call
        try:
            self._sandbox = RlmSandbox(on_llm_query=self._llm_query, tools=host_tools,
                                       **self._options)
        except RlmSandboxError as error:
            self._ended = True
            raise CodeInterpreterError(f"the sandbox could not start: {error}") from error
        self._tool_names = names

    def execute(self, code: str, variables: Optional[Dict[str, Any]] = None) -> Any:
        """Runs ``code`` after binding ``variables``; returns its output or ``FinalOutput``."""
        self.start()
        prefix = self._bind_variables(variables or {})
        self._define_late_tools()
        self._submission = None
        cell = self._run(prefix + code)
        submission, self._submission = self._submission, None
        if submission is not None:
            return FinalOutput(submission)
        if cell.status == "ok":
            return cell.stdout
        if cell.status == "error":
            kind, message = _error_message(cell.error or cell.stderr)
            if kind == "SyntaxError":
                raise SyntaxError(f"Invalid Python syntax. message: {message}")
            raise CodeExecutionError(f"{kind}: {message}")
        if cell.status in ("timeout", "memory_limit", "crashed"):
            what = {"timeout": "TimeoutError", "memory_limit": "MemoryError"}.get(
                cell.status, "SystemError")
            raise CodeExecutionError(f"{what}: {cell.error or cell.status} (the cell was "
                                     f"rolled back; variables are as they were before it)")
        self._end()
        raise CodeInterpreterError(f"the sandbox session failed: {cell.error or cell.status}")

    def __call__(self, code: str, variables: Optional[Dict[str, Any]] = None) -> Any:
        return self.execute(code, variables)

    def shutdown(self) -> None:
        """Ends the session; nothing of it is left behind. The interpreter cannot restart."""
        self._end()

    def __enter__(self) -> "RlmSandboxInterpreter":
        return self

    def __exit__(self, *_: Any) -> None:
        self.shutdown()

    # -- internals ------------------------------------------------------------------------------

    def _end(self) -> None:
        self._ended = True
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            try:
                sandbox.close()
            except RlmSandboxError:
                pass

    def _run(self, code: str) -> Any:
        try:
            return self._sandbox.execute(code)
        except RlmSandboxError as error:
            self._end()
            raise CodeInterpreterError(f"the sandbox session ended: {error}") from error

    def _bind_variables(self, variables: Dict[str, Any]) -> str:
        """The assignments that give the cell its variables (big strings are stashed once)."""
        lines = []
        for name, value in variables.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise CodeInterpreterError(f"Invalid variable name: '{name}'")
            if name in BUILTIN_NAMES:
                raise CodeInterpreterError(f"Invalid variable name: '{name}' is the interpreter's")
            if isinstance(value, str) and len(value) >= STASH_BYTES:
                digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
                index, sent = self._stashed.get(name, (STASH_INDEX + len(self._stashed), ""))
                if sent != digest:
                    self._stash(name, index, value)
                    self._stashed[name] = (index, digest)
                lines.append(f"{name} = context_{index}")
            else:
                lines.append(f"{name} = {_python_literal(value)}")
        return "".join(line + "\n" for line in lines)

    def _stash(self, name: str, index: int, value: str) -> None:
        try:
            self._sandbox.add_context(value, index=index)
        except RlmSandboxError as error:
            if self._sandbox is not None and self._sandbox.running:
                raise CodeInterpreterError(f"could not send variable '{name}': {error}") from error
            self._end()
            raise CodeInterpreterError(f"the sandbox session ended: {error}") from error

    def _define_late_tools(self) -> None:
        """Tools added to ``tools`` after the start become functions through one host tool."""
        late = frozenset(name for name in self.tools
                         if name not in BUILTIN_NAMES and name not in self._tool_names)
        if late <= self._late_tools:
            return
        for name in late:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise CodeInterpreterError(f"Invalid tool name: '{name}'")
        code = "".join(f"def {name}(*args, **kwargs):\n"
                       f"    return {_LATE_TOOL}({name!r}, *args, **kwargs)\n"
                       for name in sorted(late))
        cell = self._run(code)
        if cell.status != "ok":
            raise CodeInterpreterError(f"could not define tools: {cell.error or cell.status}")
        self._late_tools = late

    def _host_tool(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._invoke(name, args, kwargs)

        call.__name__ = name
        return call

    def _late_tool_call(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        return self._invoke(str(name), args, kwargs)

    def _invoke(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        fn = self.tools.get(name)
        if fn is None or name in BUILTIN_NAMES:
            raise CodeInterpreterError(f"Unknown tool: {name}")
        result = _call_tool(fn, args, dict(kwargs))
        try:
            return _json_value(result)
        except CodeInterpreterError:
            return str(result)

    def _llm_query(self, prompt: Any, model: Optional[str]) -> str:
        fn = self.tools.get("llm_query")
        if fn is None:
            raise RuntimeError("llm_query is not available (dspy.RLM provides it through tools)")
        return str(fn(prompt))

    def _submit(self, *args: Any, **kwargs: Any) -> None:
        names = [str(f["name"]) for f in (self.output_fields or [])] or ["output"]
        if len(args) > len(names):
            raise TypeError(f"SUBMIT() takes {len(names)} positional arguments but "
                            f"{len(args)} were given")
        output = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"SUBMIT() got an unexpected keyword argument '{name}'")
            if name in output:
                raise TypeError(f"SUBMIT() got multiple values for argument '{name}'")
            output[name] = value
        missing = [name for name in names if name not in output]
        if missing:
            raise TypeError(f"SUBMIT() missing {len(missing)} required argument(s): "
                            + ", ".join(repr(name) for name in missing))
        self._submission = output
        raise _Submitted(_SUBMITTED)


class _Submitted(Exception):
    """Ends a cell that called SUBMIT (the cell sees it as a RuntimeError)."""
