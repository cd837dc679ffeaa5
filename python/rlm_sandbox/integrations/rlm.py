r"""An environment for the RLM library (``rlm``, github alexzhang13/rlm) that runs in rlm-sandbox.

``RlmSandboxREPL`` has the interface of the library's ``LocalREPL`` (its ``BaseEnv`` plus the
``SupportsPersistence`` protocol), so the library's completion loop drives it unchanged: each
``execute_code`` runs one cell in a persistent, sandboxed Python session and returns a
``REPLResult`` (``stdout``, ``stderr``, ``locals``, ``execution_time``, ``rlm_calls``,
``final_answer``). Inside the sandbox the cells see what LocalREPL offers: ``context`` /
``context_N``, ``history`` / ``history_N``, ``answer`` (``answer["ready"] = True`` ends the
run), ``llm_query``, ``llm_query_batched``, ``rlm_query``, ``rlm_query_batched``,
``SHOW_VARS`` and the custom tools, plus ``FINAL``/``FINAL_VAR`` for older prompts.

- ``llm_query`` is answered by the library's LM handler at ``lm_handler_address`` (its socket
  protocol, spoken here with the standard library), at this environment's ``depth``.
- ``rlm_query`` goes through the library's ``subcall_fn`` when it gives one (a child RLM),
  at most ``max_concurrent_subcalls`` at once; without it, it is an ``llm_query``.
- A callable custom tool runs here, on the host, called by name from a cell. Its arguments
  and result keep their Python types across (JSON values, tuples, sets, bytes, complex, dicts in
  their order with any such keys: the ``"python"`` tool encoding, ``rlm_sandbox/_pyvalues.py``),
  and an exception it raises is raised in the cell as its own type (a builtin type itself; a
  type of the tool's own as one of that name on its nearest builtin base). Other objects (a
  DataFrame, a file) fail in the cell with a TypeError saying so; a data tool holding one makes
  the environment all the same, and the cell's use of its name raises that TypeError.
- A cell's error reaches ``stderr`` as LocalREPL writes it: ``"\n<Type>: <message>"``.
- A cell that runs too long is stopped at the policy's (or ``timeout``'s) limit and rolled
  back; the loop goes on.
- ``save(path)`` writes the session's state (variables, the cells' functions and classes,
  contexts, histories, ``/tmp``) to a file; ``load(path)`` puts it into this environment's
  session, in this process or a later one (``RlmSandbox.save``/``load``). ``fork(n)`` makes
  n new environments holding the state, each with a sandbox of its own (best-of-N).

Use it with the library's ``RLM`` class (``sandboxed()`` registers the environment)::

    from rlm import RLM
    from rlm_sandbox.integrations.rlm import sandboxed

    rlm = RLM(backend="openai", backend_kwargs={"model_name": "gpt-5-mini"},
              environment="local", environment_kwargs=sandboxed(timeout=60),
              max_depth=2, persistent=True)
    print(rlm.completion(open("big.txt").read(), root_prompt="Who wrote it?").response)

``environment="local"`` keeps the library's wiring for local environments (the ``rlm_query``
callback, persistence, compaction); the ``rlm_sandbox`` key that ``sandboxed()`` puts in
``environment_kwargs`` makes the library build this environment instead of ``LocalREPL``,
for the root and for every child RLM. ``register()`` (which ``sandboxed()`` calls) also makes
``environment="rlm_sandbox"`` work as ``environment="local"`` does, child RLMs and
``persistent=True`` included.

Without the library installed, ``REPLResult`` and the recorded calls are stand-ins with the
same fields (``REPLResult`` and ``ChatCompletion`` below).
"""

from __future__ import annotations

import inspect
import itertools
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from collections import abc
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from .. import RlmSandbox
from .._calls import current_call_id
from .._fork import checked_count
from .._requests import loaded
from . import _lm_handler

try:  # the library's own types, when it is installed and importable
    from rlm.core.types import REPLResult as _LibraryREPLResult
    from rlm.core.types import RLMChatCompletion as _LibraryChatCompletion
    from rlm.environments.base_env import NonIsolatedEnv as _EnvBase
except Exception:  # noqa: BLE001 - absent, or present without its own dependencies
    _LibraryREPLResult = None
    _LibraryChatCompletion = None
    _EnvBase = object

#: Names a custom tool may not take: the library's reserved names and the older finishers.
RESERVED_NAMES = frozenset({
    "llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS",
    "answer", "context", "history", "FINAL", "FINAL_VAR"})

#: Options of the sandbox itself, taken from keyword arguments or the ``rlm_sandbox`` dict.
SANDBOX_OPTIONS = frozenset({
    "policy", "backend", "timeout", "memory", "binary", "extra_args", "env", "server",
    "echo", "locals", "llm_timeout", "llm_budget", "llm_concurrency", "max_llm_workers",
    "lm_request_timeout"})

#: The environment name ``register()`` adds, and the key ``sandboxed()`` uses.
ENVIRONMENT_NAME = "rlm_sandbox"

#: A cell printing how many contexts and histories the session holds (one past the highest
#: ``context_N``, ``history_N``); it binds no name.
_COUNT_CODE = ("print(*[1 + max([int(name[len(prefix):]) for name in globals() "
               "if name.startswith(prefix) and name[len(prefix):].isdigit()], default=-1) "
               "for prefix in ('context_', 'history_')])")


@dataclass
class ChatCompletion:
    """Stand-in for the library's ``RLMChatCompletion`` (one call made from a cell)."""

    root_model: str
    prompt: Any
    response: str
    usage_summary: Dict[str, Any] = field(default_factory=dict)
    execution_time: float = 0.0
    metadata: Optional[Dict[str, Any]] = None
    error: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        out = {"root_model": self.root_model, "prompt": self.prompt, "response": self.response,
               "usage_summary": self.usage_summary, "execution_time": self.execution_time}
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if self.error is not None:
            out["error"] = self.error
        return out


class _StandInREPLResult:
    """Stand-in for the library's ``REPLResult`` with the same constructor and fields."""

    def __init__(self, stdout: str, stderr: str, locals: dict, execution_time: float = None,
                 rlm_calls: list = None, final_answer: Optional[str] = None) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.locals = locals
        self.execution_time = execution_time
        self.rlm_calls = rlm_calls or []
        self.final_answer = final_answer

    @property
    def llm_calls(self) -> list:
        """The library's older name for ``rlm_calls``."""
        return self.rlm_calls

    def __str__(self) -> str:
        return (f"REPLResult(stdout={self.stdout}, stderr={self.stderr}, locals={self.locals}, "
                f"execution_time={self.execution_time}, rlm_calls={len(self.rlm_calls)})")

    def to_dict(self) -> Dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "locals": dict(self.locals),
                "execution_time": self.execution_time,
                "rlm_calls": [call.to_dict() if hasattr(call, "to_dict") else call
                              for call in self.rlm_calls],
                "final_answer": self.final_answer}


#: ``REPLResult``: the library's class when ``rlm`` is importable, else the stand-in.
REPLResult = _LibraryREPLResult if _LibraryREPLResult is not None else _StandInREPLResult


def _completion_from_json(data: Dict[str, Any]) -> Any:
    """A chat-completion record from the handler's JSON: the library's type when present."""
    if _LibraryChatCompletion is not None:
        try:
            return _LibraryChatCompletion.from_dict(data)
        except Exception:  # noqa: BLE001 - a record that does not fit: keep the stand-in
            pass
    return ChatCompletion(root_model=str(data.get("root_model") or "unknown"),
                          prompt=data.get("prompt"), response=str(data.get("response") or ""),
                          usage_summary=data.get("usage_summary") or {},
                          execution_time=float(data.get("execution_time") or 0.0),
                          metadata=data.get("metadata"), error=data.get("error"))


def _exception_line(error: str) -> str:
    """LocalREPL's ``f"{type(e).__name__}: {e}"`` from the worker's traceback text: what follows
    the last traceback's frames (a frame line is indented; the exception's is not)."""
    text = error.rstrip()
    start = text.rfind("Traceback (most recent call last):")
    lines = text[start:].splitlines()[1:] if start >= 0 else text.splitlines()
    for index, line in enumerate(lines):
        if line and not line[0].isspace():
            return "\n".join(lines[index:])
    return text


def _failure_text(cell: Any) -> str:
    """What LocalREPL would add to stderr for a cell that did not end normally."""
    if cell.status == "ok":
        return ""
    if cell.status == "error":
        return _exception_line(cell.error or "Error")
    what = {"timeout": "TimeoutError", "memory_limit": "MemoryError",
            "crashed": "SystemError"}.get(cell.status, "RuntimeError")
    detail = (cell.error or cell.status).rstrip()
    rolled = " (the cell was rolled back: variables are as they were before it)" \
        if cell.rolled_back else ""
    return f"{what}: {detail}{rolled}"


class _Variables(abc.Mapping):
    """LocalREPL's ``locals`` read from the live session: ``env.locals["x"]`` fetches ``x``.

    A value comes back as JSON data when it is (str, numbers, lists, dicts, ...), else as its
    ``repr``; iterating lists the cells' variables (not the reserved names, which can still be
    looked up: ``env.locals["context_0"]``).
    """

    def __init__(self, env: "RlmSandboxREPL") -> None:
        self._env = env

    def _fetch(self, name: str) -> Dict[str, Any]:
        if self._env._sandbox is None:  # cleaned up: no variables, as LocalREPL's cleared dict
            return {"error": "the session was cleaned up"}
        fetched = self._env._sandbox.execute("", fetch=name).fetched
        return fetched if isinstance(fetched, dict) else {"error": "nothing fetched"}

    def __getitem__(self, name: str) -> Any:
        fetched = self._fetch(name)
        if "value" not in fetched:
            raise KeyError(name)
        return fetched["value"]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and "value" in self._fetch(name)

    def __iter__(self) -> Iterator[str]:
        if self._env._sandbox is None:
            return iter([])
        listed = self._env._sandbox.execute("", locals=True).locals or []
        return iter([entry["name"] for entry in listed
                     if isinstance(entry, dict) and isinstance(entry.get("name"), str)])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class RlmSandboxREPL(_EnvBase):
    """A LocalREPL-compatible RLM environment whose cells run in an rlm-sandbox session.

    The first ten arguments are those the library's ``RLM`` passes to any environment. The
    sandbox's own options (``policy``, ``backend``, ``timeout`` per cell in seconds,
    ``memory``, ``binary``, ``extra_args``, ``env``, ``server``, ``echo`` (default False, as
    ``exec`` in LocalREPL), ``locals`` (list the variables in each result, default True),
    ``llm_timeout``, ``llm_budget``, ``llm_concurrency``, ``max_llm_workers``,
    ``lm_request_timeout``) come as keyword arguments or in one ``rlm_sandbox`` dict.
    """

    def __init__(self, lm_handler_address: Optional[Tuple[str, int]] = None,
                 context_payload: Any = None, setup_code: Optional[str] = None,
                 persistent: bool = False, depth: int = 1,
                 subcall_fn: Optional[Callable[[Any, Optional[str]], Any]] = None,
                 custom_tools: Optional[Dict[str, Any]] = None,
                 custom_sub_tools: Optional[Dict[str, Any]] = None,
                 compaction: bool = False, max_concurrent_subcalls: int = 4,
                 rlm_sandbox: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        self._configure(lm_handler_address, persistent=persistent, depth=depth,
                        subcall_fn=subcall_fn, custom_tools=custom_tools,
                        custom_sub_tools=custom_sub_tools, compaction=compaction,
                        max_concurrent_subcalls=max_concurrent_subcalls,
                        rlm_sandbox=rlm_sandbox, kwargs=kwargs)
        self._initial_context = context_payload
        self.setup()
        if compaction:
            self._inject_compaction_history()
        if setup_code:
            self.execute_code(setup_code)

    def _configure(self, lm_handler_address: Optional[Tuple[str, int]], *, persistent: bool,
                   depth: int, subcall_fn: Optional[Callable[[Any, Optional[str]], Any]],
                   custom_tools: Optional[Dict[str, Any]],
                   custom_sub_tools: Optional[Dict[str, Any]], compaction: bool,
                   max_concurrent_subcalls: int, rlm_sandbox: Optional[Dict[str, Any]],
                   kwargs: Dict[str, Any]) -> None:
        """Everything the constructor sets but the session (``setup()`` starts it)."""
        options = dict(rlm_sandbox or {})
        unknown = set(options) - SANDBOX_OPTIONS
        if unknown:
            raise TypeError(f"unknown rlm_sandbox options: {sorted(unknown)}")
        kwargs = dict(kwargs)
        for name in list(kwargs):
            if name in SANDBOX_OPTIONS:
                options[name] = kwargs.pop(name)
        #: What fork() configures each branch with (its sandbox comes from RlmSandbox.fork).
        self._fork_config: Dict[str, Any] = dict(
            persistent=persistent, depth=depth, subcall_fn=subcall_fn, custom_tools=custom_tools,
            custom_sub_tools=custom_sub_tools, compaction=compaction,
            max_concurrent_subcalls=max_concurrent_subcalls, rlm_sandbox=dict(options),
            kwargs=dict(kwargs))
        if _EnvBase is object:
            self.persistent = persistent
            self.depth = depth
            self.max_concurrent_subcalls = max_concurrent_subcalls
            self.kwargs = kwargs
        else:
            super().__init__(persistent=persistent, depth=depth,
                             max_concurrent_subcalls=max_concurrent_subcalls, **kwargs)
        self.lm_handler_address = lm_handler_address
        self.subcall_fn = subcall_fn
        self.custom_tools = dict(custom_tools or {})
        self.custom_sub_tools = (custom_sub_tools if custom_sub_tools is not None
                                 else self.custom_tools)
        clashes = sorted(set(self.custom_tools) & RESERVED_NAMES)
        if clashes:
            raise ValueError(f"Custom tools cannot override reserved REPL functions: {clashes}. "
                             f"Reserved names: {sorted(RESERVED_NAMES)}")
        self.compaction = compaction
        self._compaction_history: List[Any] = []
        self._options = options
        self._list_locals = bool(options.pop("locals", True))
        self._lm_request_timeout = options.pop("lm_request_timeout",
                                               _lm_handler.DEFAULT_TIMEOUT)
        self._calls_lock = threading.Lock()
        self._pending_calls: List[Tuple[int, Any]] = []  # (order the call arrived, record)
        self._call_order = itertools.count()
        self._subcalls = threading.BoundedSemaphore(max(1, int(max_concurrent_subcalls)))
        self._context_count = 0
        self._history_count = 0
        self._sandbox: Optional[RlmSandbox] = None
        self._initial_context: Any = None

    # -- BaseEnv --------------------------------------------------------------------------------

    def setup(self) -> None:
        """Starts the sandbox session (a fresh one: an earlier session is closed first)."""
        if self._sandbox is not None:
            self.cleanup()
        options = dict(self._options)
        options.setdefault("echo", False)
        context, self._initial_context = self._initial_context, None
        self._sandbox = RlmSandbox(context=context, on_llm_query=self._answer_llm_query,
                                   on_rlm_query=self._answer_rlm_query,
                                   tools=self.custom_tools or None,
                                   tool_encoding="python", **options)
        self._context_count = 0 if context is None else 1
        self._history_count = 0

    def load_context(self, context_payload: Any) -> None:
        """Makes ``context_payload`` the session's ``context_0`` (and ``context``)."""
        self.add_context(context_payload, 0)

    def execute_code(self, code: str) -> Any:
        """Runs one cell; returns a ``REPLResult`` (the library's when installed)."""
        start = time.perf_counter()
        with self._calls_lock:
            self._pending_calls = []
        cell = self._session().execute(code, locals=self._list_locals)
        with self._calls_lock:
            pending, self._pending_calls = self._pending_calls, []
        # In the order the cell made the calls (a batch's in prompt order), however they ran.
        calls = [record for _, record in sorted(pending, key=lambda item: item[0])]
        stderr = cell.stderr
        failure = _failure_text(cell)
        if failure:
            stderr = f"{stderr}\n{failure}" if stderr else f"\n{failure}"
        final_answer = cell.answer
        if final_answer is None and cell.has_final:  # FINAL / FINAL_VAR of older prompts
            final_answer = str(cell.final)
        # LocalREPL's locals hold the values: a small JSON one comes as itself, others as repr.
        variables = {entry.get("name"): entry["value"] if "value" in entry else entry.get("repr")
                     for entry in (cell.locals or []) if isinstance(entry, dict)}
        return REPLResult(stdout=cell.stdout, stderr=stderr, locals=variables,
                          execution_time=time.perf_counter() - start, rlm_calls=calls,
                          final_answer=final_answer)

    def cleanup(self) -> None:
        """Closes the sandbox session (idempotent); nothing of it is left behind."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()

    @property
    def locals(self) -> Mapping[str, Any]:
        """The session's variables, as LocalREPL's ``locals`` (each lookup asks the session)."""
        return _Variables(self)

    def __enter__(self) -> "RlmSandboxREPL":
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self.cleanup()
        return False

    def __del__(self) -> None:
        # At interpreter exit the client's own safety net ends the process; closing from
        # here then could wait on threads that no longer run.
        if sys.is_finalizing():
            return
        try:
            self.cleanup()
        except Exception:  # noqa: BLE001
            pass

    # -- SupportsPersistence --------------------------------------------------------------------

    def update_handler_address(self, address: Tuple[str, int]) -> None:
        """Points ``llm_query`` at the LM handler of the next completion."""
        self.lm_handler_address = address

    def add_context(self, context_payload: Any, context_index: Optional[int] = None) -> int:
        """Adds ``context_N`` (``context`` when N is 0) to the live session; returns N."""
        index = self._session().add_context(context_payload, index=context_index)
        self._context_count = max(self._context_count, int(index) + 1)
        return int(index)

    def get_context_count(self) -> int:
        return self._context_count

    def add_history(self, message_history: List[Dict[str, Any]],
                    history_index: Optional[int] = None) -> int:
        """Adds ``history_N`` (``history`` when N is 0), a copy of the messages; returns N."""
        index = self._session().add_history(message_history, index=history_index)
        self._history_count = max(self._history_count, int(index) + 1)
        return int(index)

    def get_history_count(self) -> int:
        return self._history_count

    def append_compaction_entry(self, entry: Any) -> None:
        """Compaction: appends a trajectory segment or summary to the ``history`` list.

        The whole list is sent again each time (as DockerREPL does). Unlike LocalREPL, once a
        ``history_0`` exists (persistent mode's ``add_history``) ``history`` is that, the
        session's reserved alias, and the compaction list is no longer visible by that name.
        """
        if not self.compaction:
            return
        self._compaction_history.append(json.loads(json.dumps(entry)))
        self._inject_compaction_history()

    # -- save and restore -----------------------------------------------------------------------

    def save(self, path: Any) -> Any:
        """Saves the session's state to the file `path` (``RlmSandbox.save``): the variables,
        the functions and classes the cells defined, contexts, histories, the sandbox's
        ``/tmp`` and cwd. Returns the ``CellResult``: ``saved["skipped"]`` lists the variables
        the file does not hold (generators, open files...); a failed save leaves no file."""
        return self._session().save(path)

    def load(self, path: Any) -> Any:
        """Replaces the session's state with the one saved at `path` (by this environment or
        any sandbox of the same policy and rlm-sandbox build), then takes the context and
        history counts from it. Returns the ``CellResult``. Raises ``RlmSandboxError`` when the
        file is refused (changed, cut short, another policy) or cannot be loaded; the session
        then keeps its state. The host's compaction entries are not in the file: a later
        ``append_compaction_entry`` sends this environment's own list again."""
        result = loaded(self._session().load(path), path)
        self._take_counts()
        return result

    def fork(self, n: int) -> List["RlmSandboxREPL"]:
        """`n` new environments of this class (1 to 64), each with a sandbox of its own
        holding this session's state as it is now (``RlmSandbox.fork``: one save, then the
        branches opened with this environment's sandbox options and loaded concurrently):
        variables, the cells' functions and classes, contexts, histories, ``/tmp``. Each
        branch has this environment's configuration (LM handler address, depth, tools,
        ``subcall_fn``, persistence, compaction entries so far) and its own context and
        history counts (taken from its state, as ``load`` does); its ``llm_query`` calls are
        recorded in its own results. What a branch runs is seen neither by this environment
        nor by the other branches; ``cleanup()`` each when done. Best-of-N::

            branches = env.fork(4)
            results = [b.execute_code(code) for b, code in zip(branches, candidates)]
            ...
            for b in branches:
                b.cleanup()

        Raises ``ValueError`` for an `n` outside 1..64 and ``RlmSandboxError`` when the state
        could not be saved or a branch could not be opened or loaded (every branch opened is
        closed first); this environment goes on unchanged either way.
        """
        sandbox = self._session()
        checked_count(n)
        branches = [self._new_branch() for _ in range(n)]
        # Each branch's sandbox answers its cells' calls through the branch's own methods.
        sandboxes = sandbox._fork(n, lambda index: {
            "on_llm_query": branches[index]._answer_llm_query,
            "on_rlm_query": branches[index]._answer_rlm_query})
        for branch, branch_sandbox in zip(branches, sandboxes):
            branch._sandbox = branch_sandbox
        try:
            for branch in branches:
                branch._take_counts()
        except BaseException:
            for branch in branches:
                try:
                    branch.cleanup()
                except Exception:  # noqa: BLE001 - the first error is the one to raise
                    pass
            raise
        return branches

    def _new_branch(self) -> "RlmSandboxREPL":
        """An environment configured as this one, with no session yet (fork())."""
        branch = type(self).__new__(type(self))
        branch._configure(self.lm_handler_address, **self._fork_config)
        branch._compaction_history = json.loads(json.dumps(self._compaction_history))
        return branch

    def _take_counts(self) -> None:
        """The context and history counts, read from the session's state (after a load)."""
        counts = self._session().execute(_COUNT_CODE).stdout.split()
        if len(counts) == 2 and all(count.isdigit() for count in counts):
            self._context_count, self._history_count = (int(count) for count in counts)

    # -- the sandbox's calls --------------------------------------------------------------------

    def _session(self) -> RlmSandbox:
        if self._sandbox is None:
            raise RuntimeError("the RlmSandboxREPL was cleaned up; create a new one")
        return self._sandbox

    def _inject_compaction_history(self) -> None:
        text = json.dumps(self._compaction_history)
        self._session().execute(f"import json as _json\nhistory = _json.loads({text!r})\n"
                                f"del _json")

    def _call_position(self) -> int:
        """Where a call's record goes in ``rlm_calls``: the host's id for it (the order the cell
        made its calls, a batch's in prompt order, as LocalREPL sorts a batch's records)."""
        call_id = current_call_id()
        return call_id if call_id is not None else next(self._call_order)

    def _record(self, order: int, completion: Any) -> None:
        with self._calls_lock:
            self._pending_calls.append((order, completion))

    def _answer_llm_query(self, prompt: Any, model: Optional[str]) -> str:
        """A cell's ``llm_query``: one request to the library's LM handler."""
        order = self._call_position()
        address = self.lm_handler_address
        if not address:
            raise RuntimeError("No LM handler configured")
        message: Dict[str, Any] = {"prompt": prompt, "depth": self.depth}
        if model is not None:
            message["model"] = model
        try:
            answer = _lm_handler.request(tuple(address), message, self._lm_request_timeout)
        except Exception as error:  # noqa: BLE001 - the cell sees the text, as in LocalREPL
            raise RuntimeError(f"LM query failed - {error}") from error
        if answer.get("error") is not None:
            raise RuntimeError(str(answer["error"]))
        data = answer.get("chat_completion")
        if not isinstance(data, dict):
            raise RuntimeError("No chat completion or error provided.")
        completion = _completion_from_json(data)
        self._record(order, completion)
        return str(completion.response)

    def _answer_rlm_query(self, prompt: Any, model: Optional[str]) -> str:
        """A cell's ``rlm_query``: a child RLM through ``subcall_fn``, else an llm_query."""
        if self.subcall_fn is None:
            return self._answer_llm_query(prompt, model)
        order = self._call_position()
        with self._subcalls:
            try:
                completion = self.subcall_fn(prompt, model)
            except Exception as error:  # noqa: BLE001
                raise RuntimeError(f"RLM query failed - {error}") from error
        self._record(order, completion)
        return str(getattr(completion, "response", completion))


def _make_router(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_environment(environment: str, environment_kwargs: Dict[str, Any]) -> Any:
        kwargs = dict(environment_kwargs or {})
        if environment == ENVIRONMENT_NAME or ENVIRONMENT_NAME in kwargs:
            return RlmSandboxREPL(**kwargs)
        return original(environment, environment_kwargs)

    get_environment.rlm_sandbox_router = True  # type: ignore[attr-defined]
    get_environment.__wrapped__ = original  # type: ignore[attr-defined]
    return get_environment


def _name_as_local(original_init: Callable[..., Any]) -> Callable[..., Any]:
    """``RLM(environment="rlm_sandbox", ...)`` made ``environment="local"`` with the
    ``rlm_sandbox`` key in its kwargs: the library wires local environments alone (the
    ``rlm_query`` callback for child RLMs, ``persistent=True``, compaction), and the key makes
    every one of them an ``RlmSandboxREPL``."""
    signature = inspect.signature(original_init)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # let the library word the mistake
            return original_init(self, *args, **kwargs)
        if bound.arguments.get("environment") == ENVIRONMENT_NAME:
            bound.arguments["environment"] = "local"
            environment_kwargs = dict(bound.arguments.get("environment_kwargs") or {})
            environment_kwargs.setdefault(ENVIRONMENT_NAME, {})
            bound.arguments["environment_kwargs"] = environment_kwargs
        return original_init(*bound.args, **bound.kwargs)

    __init__.rlm_sandbox_router = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    return __init__


def register() -> None:
    """Teaches the installed RLM library to build ``RlmSandboxREPL`` (idempotent).

    After it, the library's ``get_environment`` returns an ``RlmSandboxREPL`` for
    ``environment="rlm_sandbox"`` and for any environment whose kwargs hold an ``rlm_sandbox``
    key (see ``sandboxed()``); everything else goes to the library as before. ``RLM(...,
    environment="rlm_sandbox")`` is then wired as ``environment="local"`` is (child RLMs through
    ``rlm_query``, ``persistent=True``, compaction), with every environment sandboxed; the
    library's log names the environment ``local``.
    Raises ``ImportError`` when the library cannot be imported.
    """
    import rlm.core.rlm as core  # noqa: PLC0415 - only when asked for
    import rlm.environments as environments  # noqa: PLC0415

    for module in (environments, core):
        current = getattr(module, "get_environment")
        if not getattr(current, "rlm_sandbox_router", False):
            module.get_environment = _make_router(current)
    library_rlm = getattr(core, "RLM", None)
    if library_rlm is not None and \
            not getattr(library_rlm.__init__, "rlm_sandbox_router", False):
        library_rlm.__init__ = _name_as_local(library_rlm.__init__)


def sandboxed(**options: Any) -> Dict[str, Any]:
    """``environment_kwargs`` for the library's ``RLM`` that select ``RlmSandboxREPL``.

    ``options`` are the sandbox's (``policy``, ``timeout``, ``memory``, ...; see
    ``RlmSandboxREPL``). Registers the environment with the library first (``register()``).
    """
    unknown = set(options) - SANDBOX_OPTIONS
    if unknown:
        raise TypeError(f"unknown rlm_sandbox options: {sorted(unknown)}")
    register()
    return {ENVIRONMENT_NAME: dict(options)}
