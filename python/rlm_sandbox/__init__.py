r"""A small client for ``rlm-sandbox repl``: a persistent, sandboxed Python REPL for RLMs.

Stdlib only (Python 3.9+). Copy the ``rlm_sandbox`` package next to your orchestrator, or put
the repository's ``python`` directory on ``PYTHONPATH``. The client starts ``rlm-sandbox repl`` and talks to it in JSON lines over the
process's stdin/stdout (DESIGN.md §6 and §8); the sandbox's ``llm_query`` calls come back to
your Python callback.

Inside the sandbox every cell sees what the RLM library's REPL gives it: ``context`` (and
``context_N``, ``history_N`` added with ``add_context``/``add_history``), ``answer`` (a cell that
sets ``answer["ready"] = True`` finishes: ``CellResult.answer``), ``llm_query``,
``llm_query_batched``, ``rlm_query``, ``rlm_query_batched`` (answered by your callbacks),
your host ``tools``, ``FINAL``, ``FINAL_VAR`` and ``SHOW_VARS()``; variables persist from cell to
cell, and a cell that times out or hits a limit is rolled back to the state before it.

With a server (``rlm-sandbox serve``): ``RlmSandbox(server=PATH)`` (or ``$RLM_SANDBOX_SERVER``)
opens the session from the server's warm sessions over its socket, with no process started
here; ``Server(PATH).run(["cmd", ...])`` runs a command there and returns a :class:`RunResult`.
With several servers (a fleet's nodes): ``Fleet(SOURCE)`` (or ``$RLM_SANDBOX_FLEET``) places each
``run`` and ``session`` on the best of 3 random nodes by free room (docs/fleet.md). A server's TLS
listener is reached at ``tls://HOST:PORT`` wherever a socket path is taken, with ``tls_cert=``,
``tls_key=`` and ``tls_ca=`` (or ``$RLM_SANDBOX_TLS_CERT``, ``_KEY``, ``_CA``).

A minimal RLM loop (``ask_model(messages) -> str`` is your LM call)::

    import re
    from rlm_sandbox import RlmSandbox

    def rlm_loop(question, document, ask_model, max_turns=10):
        def sub_query(prompt, model):            # llm_query() inside the sandbox
            return ask_model([{"role": "user", "content": prompt}])

        messages = [
            {"role": "system", "content": "A Python REPL holds the document in `context`. "
             "Reply with ```python``` blocks; call llm_query(prompt) on chunks; "
             "to finish, set answer['content'] and then answer['ready'] = True."},
            {"role": "user", "content": question},
        ]
        with RlmSandbox(context=document, on_llm_query=sub_query, timeout=30) as sb:
            for _ in range(max_turns):
                reply = ask_model(messages)
                messages.append({"role": "assistant", "content": reply})
                for code in re.findall(r"```python\n(.*?)```", reply, re.S):
                    cell = sb.execute(code)
                    if cell.answer is not None:
                        return cell.answer
                    messages.append({"role": "user", "content":
                                     f"[{cell.status}]\n{cell.stdout[-4000:]}"
                                     f"{cell.error or ''}"})
        return None

Start-up: the process is started in ``__init__``, which returns once the sandbox is up (or
raises :class:`RlmSandboxError` with the CLI's own message). ``rlm-sandbox repl`` opens the
sandbox only when it reads its first request (that line may carry the context), so the
constructor sends an empty ``execute`` cell to get the ``ready`` event.
"""

from ._process import MAX_LINE_BYTES
from ._wire import ServerError
from .fleet import Fleet, fleet_from_environment, read_fleet
from .result import CellResult, LlmCallback, RlmSandboxError, RunResult
from .server import Server, ServerSession, server_from_environment
from .session import RlmSandbox

__all__ = ["MAX_LINE_BYTES", "CellResult", "Fleet", "LlmCallback", "RlmSandbox",
           "RlmSandboxError", "RunResult", "Server", "ServerError", "ServerSession",
           "fleet_from_environment", "read_fleet", "server_from_environment"]
