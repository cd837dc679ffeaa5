"""Test doubles written from the RLM library's interfaces (no third-party code).

- ``FakeLMHandler``: a TCP server speaking the library's LM handler protocol (a 4-byte
  big-endian length, then UTF-8 JSON; one request per connection), answering with a function.
- ``find_code_blocks``: the library's convention for the model's code (```repl blocks).
- ``ScriptedLM``: a "model" that returns prepared turns in order and records its prompts.
- ``run_completion``: the shape of the library's ``RLM.completion`` loop, for one turn.
- ``SANDBOX``: the sandbox options every test uses (this build's binary, the namespace
  backend); ``require_binary`` is each test module's ``setUpModule``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socketserver
import struct
import threading
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple

BINARY = os.environ.get("RLM_SANDBOX_BIN") or shutil.which("rlm-sandbox")
SANDBOX: Dict[str, Any] = {"binary": BINARY, "backend": "namespace"}


def require_binary() -> None:
    """Skips a test module when there is no rlm-sandbox binary to test against."""
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")


def _recv_exactly(sock: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class FakeLMHandler:
    """An LM handler: ``respond(prompt, model, depth) -> str`` (raise to fail that prompt)."""

    def __init__(self, respond: Callable[[Any, Optional[str], int], str],
                 model_name: str = "fake-model") -> None:
        self.respond = respond
        self.model_name = model_name
        self.requests: List[Dict[str, Any]] = []
        self._lock = threading.Lock()
        handler = self

        class _Request(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                (length,) = struct.unpack(">I", _recv_exactly(self.request, 4))
                message = json.loads(_recv_exactly(self.request, length))
                reply = handler._answer(message)
                payload = json.dumps(reply).encode()
                self.request.sendall(struct.pack(">I", len(payload)) + payload)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Request)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> Tuple[str, int]:
        host, port = self._server.server_address[:2]
        return (host, port)

    def _completion(self, prompt: Any, model: Optional[str], depth: int) -> Dict[str, Any]:
        try:
            text = self.respond(prompt, model, depth)
        except Exception as error:  # noqa: BLE001 - the failure is the answer
            return {"root_model": model or self.model_name, "prompt": prompt, "response": "",
                    "usage_summary": {"model_usage_summaries": {}}, "execution_time": 0.0,
                    "error": f"llm() call failed - {error}"}
        return {"root_model": model or self.model_name, "prompt": prompt, "response": text,
                "usage_summary": {"model_usage_summaries": {self.model_name: {
                    "total_calls": 1, "total_input_tokens": 1, "total_output_tokens": 1}}},
                "execution_time": 0.001}

    def _answer(self, message: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            self.requests.append(message)
        model, depth = message.get("model"), int(message.get("depth", -1))
        if message.get("prompts"):
            return {"chat_completions": [self._completion(p, model, depth)
                                         for p in message["prompts"]],
                    "chat_completion": None, "error": None}
        if not message.get("prompt"):
            return {"error": "Missing 'prompt' or 'prompts' in request.",
                    "chat_completion": None, "chat_completions": None}
        completion = self._completion(message["prompt"], model, depth)
        if completion.get("error"):
            return {"error": completion["error"], "chat_completion": None,
                    "chat_completions": None}
        return {"chat_completion": completion, "chat_completions": None, "error": None}

    def start(self) -> "FakeLMHandler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeLMHandler":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def find_code_blocks(text: str) -> List[str]:
    """The model's code: the bodies of its ```repl blocks, in order."""
    return [m.group(1).strip() for m in re.finditer(r"```repl\s*\n(.*?)\n```", text, re.S)]


class ScriptedLM:
    """A model that answers with prepared turns, in order; records every prompt."""

    def __init__(self, turns: List[str]) -> None:
        self.turns = list(turns)
        self.prompts: List[Any] = []

    def completion(self, messages: Any) -> str:
        self.prompts.append(json.loads(json.dumps(messages)))
        if not self.turns:
            raise AssertionError("the scripted model ran out of turns")
        return self.turns.pop(0)


def run_completion(environment: Any, model: ScriptedLM, question: str,
                   max_iterations: int = 10) -> Tuple[Optional[str], List[Dict[str, Any]],
                                                      List[Any]]:
    """One turn of the library's loop: prompt, run the code blocks, stop at a final answer.

    Returns (final answer or None, the message history, every REPLResult in order). Like the
    library, it tells the model how many contexts and histories the environment holds, and
    after a final answer stores the turn's messages with ``add_history``.
    """
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": "You have a Python REPL: write ```repl``` blocks. "
         "Set answer['content'] and answer['ready'] = True when done."},
        {"role": "user", "content": question}]
    results: List[Any] = []
    for iteration in range(max_iterations):
        messages.append({"role": "user", "content":
                         f"Iteration {iteration}: {environment.get_context_count()} contexts, "
                         f"{environment.get_history_count()} histories."})
        response = model.completion(messages)
        final = None
        outputs = []
        for code in find_code_blocks(response):
            result = environment.execute_code(code)
            results.append(result)
            outputs.append(f"REPL output:\n{result.stdout}\n{result.stderr}")
            if result.final_answer is not None and final is None:
                final = result.final_answer
        if final is not None:
            environment.add_history(messages)
            return final, messages, results
        messages.append({"role": "assistant", "content": response})
        if outputs:
            messages.append({"role": "user", "content": "\n\n".join(outputs)})
    return None, messages, results
