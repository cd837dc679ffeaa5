"""Contract tests for rlm_sandbox.integrations.dspy.RlmSandboxInterpreter against the sandbox.

Written from DSPy's CodeInterpreter protocol and what ``dspy.RLM`` does with it (no DSPy
needed): a ``tools`` dict it updates with ``llm_query``/``llm_query_batched`` and the user's
tools (``invoke(**kwargs)`` wrappers carrying the tool's signature), ``output_fields`` for
``SUBMIT``, ``start()`` / ``execute(code, variables)`` / ``shutdown()``; ``FinalOutput`` on
SUBMIT, ``CodeExecutionError`` / ``SyntaxError`` for the code's errors, ``CodeInterpreterError``
when the session is gone. Ends with a scripted run in dspy.RLM's loop shape.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_dspy_interpreter``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import unittest
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from _fakes import SANDBOX, require_binary  # noqa: E402
from rlm_sandbox.integrations.dspy import (  # noqa: E402
    CodeExecutionError, CodeInterpreterError, FinalOutput, RlmSandboxInterpreter)



setUpModule = require_binary  # noqa: N816 - unittest's name


def make(**kwargs: Any) -> RlmSandboxInterpreter:
    return RlmSandboxInterpreter(**{**SANDBOX, **kwargs})


def as_dspy_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What dspy.RLM puts in ``tools``: a keyword-only wrapper with the tool's signature."""
    def invoke(**kwargs: Any) -> Any:
        return fn(**kwargs)

    functools.update_wrapper(invoke, fn)
    invoke.__signature__ = inspect.signature(fn)
    return invoke


class Protocol(unittest.TestCase):
    def test_has_the_code_interpreter_members(self) -> None:
        interp = make()
        self.assertIsInstance(interp.tools, dict)
        for name in ("start", "execute", "shutdown"):
            self.assertTrue(callable(getattr(interp, name)), name)
        self.assertIsInstance(RlmSandboxInterpreter.execution_instructions, str)
        interp.shutdown()  # never started: nothing to end, and no error

    def test_factory_makes_fresh_interpreters_and_carries_the_instructions(self) -> None:
        factory = RlmSandboxInterpreter.factory(timeout=5, **SANDBOX)
        self.assertEqual(factory.execution_instructions,
                         RlmSandboxInterpreter.execution_instructions)
        one, two = factory(), factory()
        self.addCleanup(one.shutdown)
        self.addCleanup(two.shutdown)
        self.assertIsNot(one, two)
        one.execute("mine = 1")
        self.assertEqual(two.execute("print('mine' in globals())"), "False\n")

    def test_start_is_idempotent_and_state_persists(self) -> None:
        with make() as interp:
            interp.start()
            pid = interp._sandbox.pid
            interp.start()
            self.assertEqual(interp._sandbox.pid, pid)
            self.assertEqual(interp.execute("x = 41"), "")
            self.assertEqual(interp.execute("print(x + 1)"), "42\n")

    def test_execute_starts_lazily_and_shutdown_ends_for_good(self) -> None:
        interp = make()
        self.assertEqual(interp.execute("print('lazy')"), "lazy\n")
        pid = interp._sandbox.pid
        interp.shutdown()
        self.assertFalse(os.path.exists(f"/proc/{pid}/cmdline")
                         and open(f"/proc/{pid}/cmdline", "rb").read())
        with self.assertRaises(CodeInterpreterError):
            interp.execute("print(1)")
        with self.assertRaises(CodeInterpreterError):
            interp.start()


class Variables(unittest.TestCase):
    def setUp(self) -> None:
        self.interp = make()
        self.addCleanup(self.interp.shutdown)

    def test_values_arrive_as_python_values(self) -> None:
        out = self.interp.execute(
            "print(repr(s), n, f, flag, none, items, mapping['k'], pair)",
            variables={"s": "it's \"quoted\"\n", "n": 3, "f": 2.5, "flag": True,
                       "none": None, "items": [1, "a"], "mapping": {"k": [1, 2]},
                       "pair": (1, 2)})
        self.assertEqual(out, "'it\\'s \"quoted\"\\n' 3 2.5 True None [1, 'a'] [1, 2] [1, 2]\n")

    def test_big_string_is_sent_once_and_rebound_before_each_cell(self) -> None:
        big = "x" * 300_000 + "END"
        self.assertEqual(self.interp.execute("print(len(doc), doc[-3:])\ndoc = 'changed'",
                                             variables={"doc": big}), "300003 END\n")
        self.assertEqual(self.interp.execute("print(len(doc))", variables={"doc": big}),
                         "300003\n")
        other = "y" * 200_000
        self.assertEqual(self.interp.execute("print(doc[0], len(doc))",
                                             variables={"doc": other}), "y 200000\n")

    def test_string_over_a_request_line_arrives_whole(self) -> None:
        big = "0123456789abcdef" * (17 << 16) + "\"'\n\u00e9"  # 17 MiB, over the 16 MiB line
        self.assertEqual(self.interp.execute("print(len(doc), repr(doc[-4:]))",
                                             variables={"doc": big}),
                         f"{len(big)} {big[-4:]!r}\n")

    def test_bad_names_are_refused(self) -> None:
        for name in ("not valid", "class", "SUBMIT"):
            with self.assertRaises(CodeInterpreterError, msg=name):
                self.interp.execute("pass", variables={name: 1})


class Submit(unittest.TestCase):
    def test_typed_submit_returns_final_output_and_ends_the_cell(self) -> None:
        with make(output_fields=[{"name": "answer", "type": "str"}, {"name": "score"}]) as it:
            result = it.execute("print('before')\nSUBMIT('yes', score=0.5)\nafter = 1")
            self.assertEqual(result, FinalOutput({"answer": "yes", "score": 0.5}))
            self.assertEqual(it.execute("print('after' in globals())"), "False\n")

    def test_default_submit_takes_one_output(self) -> None:
        with make() as it:
            self.assertEqual(it.execute("SUBMIT({'a': [1, 2]})"),
                             FinalOutput({"output": {"a": [1, 2]}}))

    def test_output_fields_set_by_dspy_after_construction(self) -> None:
        it = make()
        self.addCleanup(it.shutdown)
        it.output_fields = [{"name": "total", "type": "int"}]
        self.assertEqual(it.execute("SUBMIT(total=6)"), FinalOutput({"total": 6}))

    def test_wrong_submit_arguments_are_a_recoverable_error(self) -> None:
        with make(output_fields=[{"name": "a"}, {"name": "b"}]) as it:
            with self.assertRaises(CodeExecutionError) as caught:
                it.execute("SUBMIT(1)")
            self.assertIn("missing", str(caught.exception))
            self.assertEqual(it.execute("SUBMIT(1, 2)"), FinalOutput({"a": 1, "b": 2}))


class Tools(unittest.TestCase):
    def test_tools_run_on_the_host_with_positional_and_keyword_arguments(self) -> None:
        calls: List[Dict[str, Any]] = []

        def search(query: str, limit: int = 3) -> List[str]:
            calls.append({"query": query, "limit": limit})
            return [f"{query}-{i}" for i in range(limit)]

        with make(tools={"search": as_dspy_tool(search)}) as it:
            out = it.execute("print(search('cats', limit=2))\nprint(search(query='dogs'))")
        self.assertEqual(out, "['cats-0', 'cats-1']\n['dogs-0', 'dogs-1', 'dogs-2']\n")
        self.assertEqual(calls, [{"query": "cats", "limit": 2}, {"query": "dogs", "limit": 3}])

    def test_tool_error_is_a_runtime_error_in_the_cell(self) -> None:
        def fails(x: int) -> int:
            raise ValueError(f"bad {x}")

        with make(tools={"fails": as_dspy_tool(fails)}) as it:
            self.assertEqual(it.execute("try:\n    fails(3)\nexcept RuntimeError as e:\n"
                                        "    print('caught', 'bad 3' in str(e))"),
                             "caught True\n")
            with self.assertRaises(CodeExecutionError) as caught:
                it.execute("fails(4)")
            self.assertIn("bad 4", str(caught.exception))

    def test_tools_are_looked_up_at_call_time_and_late_tools_work(self) -> None:
        it = make(tools={"ver": as_dspy_tool(lambda: 1)})
        self.addCleanup(it.shutdown)
        self.assertEqual(it.execute("print(ver())"), "1\n")
        it.tools["ver"] = as_dspy_tool(lambda: 2)  # dspy.RLM injects fresh tools per call
        it.tools["late"] = as_dspy_tool(lambda word: word.upper())
        self.assertEqual(it.execute("print(ver(), late('hi'))"), "2 HI\n")

    def test_llm_query_uses_the_llm_query_tool(self) -> None:
        seen: List[str] = []
        lock = threading.Lock()

        def llm_query(prompt: str) -> str:
            with lock:
                seen.append(prompt)
            if prompt == "limit":
                raise RuntimeError("LLM call limit exceeded")
            return f"<{prompt}>"

        with make(tools={"llm_query": llm_query, "llm_query_batched": lambda prompts: []}) as it:
            out = it.execute("print(llm_query('a'))\nprint(llm_query_batched(['b', 'c']))\n"
                             "print(llm_query('limit'))")
        self.assertEqual(out, "<a>\n['<b>', '<c>']\nError: LLM call limit exceeded\n")
        self.assertEqual(sorted(seen), ["a", "b", "c", "limit"])


class Errors(unittest.TestCase):
    def setUp(self) -> None:
        self.interp = make(timeout=1)
        self.addCleanup(self.interp.shutdown)

    def test_exception_is_code_execution_error_with_type_and_message(self) -> None:
        with self.assertRaises(CodeExecutionError) as caught:
            self.interp.execute("undefined_name + 1")
        self.assertEqual(str(caught.exception), "NameError: name 'undefined_name' is not defined")

    def test_syntax_error_is_syntax_error(self) -> None:
        with self.assertRaises(SyntaxError):
            self.interp.execute("def broken(:\n    pass")

    def test_runaway_cell_is_recoverable_and_rolled_back(self) -> None:
        self.interp.execute("kept = 1")
        with self.assertRaises(CodeExecutionError) as caught:
            self.interp.execute("lost = 2\nwhile True:\n    pass")
        self.assertNotIsInstance(caught.exception, SyntaxError)
        self.assertIn("TimeoutError", str(caught.exception))
        self.assertEqual(self.interp.execute("print(kept, 'lost' in globals())"), "1 False\n")


class ScriptedDspyRun(unittest.TestCase):
    """dspy.RLM's loop shape: each step runs code with the inputs, until SUBMIT."""

    def test_run_to_submit(self) -> None:
        document = "\n".join(f"row {i}: value {i * 3}" for i in range(20_000))
        steps = [
            "lines = document.splitlines()\nprint(len(lines))",
            "while True:\n    pass",  # a runaway step: an error for the model, not the run
            "picked = [l for l in lines if l.startswith('row 777:')]\n"
            "summary = llm_query(f'{query}: {picked[0]}')\nprint(summary)",
            "SUBMIT(answer=summary.split()[-1])",
        ]
        history: List[str] = []
        tools = {"llm_query": lambda prompt: f"the value is {prompt.split()[-1]}"}
        inputs = {"document": document, "query": "what is row 777?"}
        with make(tools=tools, output_fields=[{"name": "answer", "type": "str"}],
                  timeout=2) as interp:
            result: Any = None
            for code in steps:
                try:
                    result = interp.execute(code, variables=dict(inputs))
                except (CodeExecutionError, SyntaxError) as error:
                    result = f"[Error] {error}"
                if isinstance(result, FinalOutput):
                    break
                history.append(str(result))
        self.assertEqual(result, FinalOutput({"answer": "2331"}))
        self.assertEqual(history[0], "20000\n")
        self.assertTrue(history[1].startswith("[Error] TimeoutError"), history[1])
        self.assertEqual(history[2], "the value is 2331\n")


if __name__ == "__main__":
    unittest.main()
