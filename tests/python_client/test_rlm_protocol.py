"""The client's issue-13 features end to end against the real ``rlm-sandbox`` binary: finishing with
``answer``, ``rlm_query``, message prompts, host tools, echo, the LM limits, ``execute(locals=,
fetch=)`` and ``add_context``/``add_history``.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_rlm_protocol`` from
tests/python_client (ctest's ``python_client_protocol``).
"""

from __future__ import annotations

import ast
import json
import threading
import time
import unittest
from typing import Any, Dict, List, Optional

from test_rlm_sandbox_client import (  # noqa: F401 - unittest runs the module fixtures by name
    CellResult, ConcurrencyMeter, RlmSandbox, SandboxTestCase, setUpModule, tearDownModule)


class FinishingTest(SandboxTestCase):
    def test_answer_ready_ends_the_run_with_its_content(self) -> None:
        sb = self.sandbox()
        result = self.run_ok(sb, "answer['content'] = 'draft'")
        self.assertIsNone(result.answer)
        result = self.run_ok(sb, "answer['content'] = 6 * 7\nanswer['ready'] = True")
        self.assertEqual(result.answer, "42")
        # Reported once (the dict keeps its keys, as LocalREPL's does); setting ready again
        # reports again.
        self.assertIsNone(self.run_ok(sb, "x = 1").answer)
        result = self.run_ok(sb, "answer['content'] = 'again'\nanswer['ready'] = True")
        self.assertEqual(result.answer, "again")
        # A cell that rebinds answer to a plain ready dict finishes too (LocalREPL's re-wrap).
        result = self.run_ok(sb, "answer = {'content': [1], 'ready': True}")
        self.assertEqual(result.answer, "[1]")

    def test_final_var_returns_the_value_as_text(self) -> None:
        sb = self.sandbox()
        result = self.run_ok(sb, "x = [1, 2]\nprint(FINAL_VAR('x'))")
        self.assertEqual(result.stdout, "[1, 2]\n")
        self.assertEqual(result.final, [1, 2])


class QueryKindsTest(SandboxTestCase):
    def test_message_list_prompt_reaches_the_callback_as_a_list(self) -> None:
        seen: List[Any] = []

        def answer(prompt: Any, model: Optional[str]) -> str:
            seen.append(prompt)
            return "ok"

        sb = self.sandbox(on_llm_query=answer)
        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"}]
        self.run_ok(sb, f"r = llm_query({messages!r})\nassert r == 'ok', r")
        self.assertEqual(seen, [messages])

    def test_rlm_query_goes_to_on_rlm_query(self) -> None:
        sb = self.sandbox(on_llm_query=lambda prompt, model: f"llm:{prompt}",
                          on_rlm_query=lambda prompt, model: f"rlm:{prompt}:{model}")
        result = self.run_ok(sb, "print(llm_query('a'), rlm_query('b', model='m'))\n"
                                 "print(rlm_query_batched(['c', 'd']))")
        self.assertEqual(result.stdout, "llm:a rlm:b:m\n['rlm:c:None', 'rlm:d:None']\n")
        self.assertEqual(result.llm_calls, 4)

    def test_rlm_query_defaults_to_on_llm_query(self) -> None:
        sb = self.sandbox(on_llm_query=lambda prompt, model: prompt.upper())
        self.assertEqual(self.run_ok(sb, "print(rlm_query('sub'))").stdout, "SUB\n")
        # A per-cell callback answers that cell's rlm_query too.
        result = self.run_ok(sb, "print(rlm_query('x'))",
                             on_llm_query=lambda prompt, model: "cell's own")
        self.assertEqual(result.stdout, "cell's own\n")

    def test_a_failing_callback_is_an_error_text_in_the_cell(self) -> None:
        def fail(prompt: Any, model: Optional[str]) -> str:
            if prompt == "bad":
                raise ValueError("no model for bad")
            return prompt

        sb = self.sandbox(on_llm_query=fail)
        result = self.run_ok(sb, "print(llm_query('bad'))\n"
                                 "print(llm_query_batched(['a', 'bad', 'c']))")
        self.assertEqual(result.stdout,
                         "Error: no model for bad\n['a', 'Error: no model for bad', 'c']\n")

    def test_a_callback_returning_a_non_str_fails_the_call(self) -> None:
        sb = self.sandbox(on_llm_query=lambda prompt, model: 42)
        result = self.run_ok(sb, "print(llm_query('q'))")
        self.assertIn("Error: on_llm_query returned int, not str", result.stdout)


class ToolsTest(SandboxTestCase):
    def test_callable_and_data_tools(self) -> None:
        calls: List[tuple] = []

        def lookup(key: str, default: Any = None) -> Any:
            calls.append((key, default))
            return {"key": key, "found": [1, 2.5, None, True], "default": default}

        sb = self.sandbox(tools={
            "lookup": {"tool": lookup, "description": "looks a key up"},
            "limits": {"tool": {"max": 3}, "description": "a data tool"},
            "names": ["a", "b"],
        })
        result = self.run_ok(sb, "r = lookup('k', default={'d': 1})\n"
                                 "print(r['key'], r['found'], r['default'])\n"
                                 "print(limits['max'], names)")
        self.assertEqual(result.stdout, "k [1, 2.5, None, True] {'d': 1}\n3 ['a', 'b']\n")
        self.assertEqual(calls, [("k", {"d": 1})])

    def test_a_tool_that_raises_is_a_runtime_error_in_the_cell(self) -> None:
        def broken() -> None:
            raise KeyError("nothing here")

        sb = self.sandbox(tools={"broken": broken})
        result = self.run_ok(sb, "try:\n    broken()\nexcept RuntimeError as error:\n"
                                 "    print('caught', error)")
        self.assertEqual(result.stdout, "caught 'nothing here'\n")

    def test_a_tool_returning_a_non_json_value_is_a_runtime_error(self) -> None:
        sb = self.sandbox(tools={"opaque": lambda: object()})
        result = sb.execute("opaque()")
        self.assertEqual(result.status, "error")
        self.assertIn("RuntimeError", result.error)
        self.assertIn("tool 'opaque' returned a value that is not JSON", result.error)

    def test_tools_are_restored_after_a_cell_rebinds_them(self) -> None:
        sb = self.sandbox(tools={"double": lambda x: 2 * x})
        self.run_ok(sb, "double = None")
        self.assertEqual(self.run_ok(sb, "print(double(21))").stdout, "42\n")

    def test_data_tools_over_a_command_line_argument_are_refused_before_starting(self) -> None:
        with self.assertRaisesRegex(ValueError, "add_context"):
            RlmSandbox(binary="/nonexistent", tools={"big": "x" * (128 * 1024)})

    def test_bad_tool_names_are_refused_before_starting(self) -> None:
        for name in ("llm_query", "context_3", "not an identifier", "class"):
            with self.assertRaises(ValueError, msg=name):
                RlmSandbox(binary="/nonexistent", tools={name: 1})


class OptionsTest(SandboxTestCase):
    def test_echo_false_prints_no_trailing_expression(self) -> None:
        sb = self.sandbox(echo=False)
        self.assertEqual(self.run_ok(sb, "x = 41\nx + 1").stdout, "")
        self.assertEqual(self.run_ok(sb, "print(x + 1)").stdout, "42\n")

    def test_llm_budget(self) -> None:
        sb = self.sandbox(llm_budget=3, on_llm_query=lambda prompt, model: "ok")
        result = self.run_ok(sb, "print(llm_query_batched(['a'] * 5))")
        answers = ast.literal_eval(result.stdout)  # the list of str the cell printed
        self.assertEqual(answers.count("ok"), 3, answers)
        self.assertTrue(all(a == "ok" or a.startswith("Error: ") for a in answers), answers)

    def test_llm_timeout(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def stuck(prompt: Any, model: Optional[str]) -> str:
            release.wait(30)
            return "late"

        sb = self.sandbox(llm_timeout=0.5, on_llm_query=stuck)
        started = time.monotonic()
        result = self.run_ok(sb, "print(llm_query('q'))")
        self.assertLess(time.monotonic() - started, 20)
        self.assertTrue(result.stdout.startswith("Error: "), result.stdout)

    def test_llm_concurrency(self) -> None:
        slow = ConcurrencyMeter(0.1)
        sb = self.sandbox(llm_concurrency=2, on_llm_query=slow)
        result = self.run_ok(sb, "print(len(llm_query_batched([str(i) for i in range(8)])))")
        self.assertEqual(result.stdout, "8\n")
        self.assertEqual(slow.most, 2)
        self.assertIn(["--llm-concurrency", "2"], [sb.args[i:i + 2] for i in range(len(sb.args))])


class LocalsAndFetchTest(SandboxTestCase):
    def test_locals_lists_the_cells_variables(self) -> None:
        sb = self.sandbox(context="text")
        result = self.run_ok(sb, "import os\nx = 42\nname = 'a' * 500\n_hidden = 1\n"
                                 "def f():\n    pass", locals=True)
        by_name = {entry["name"]: entry for entry in result.locals}
        self.assertEqual(by_name["x"], {"name": "x", "type": "int", "repr": "42", "value": 42})
        self.assertEqual(by_name["name"]["type"], "str")
        self.assertLessEqual(len(by_name["name"]["repr"]), 200)
        self.assertIn("f", by_name)
        for absent in ("os", "_hidden", "context", "llm_query", "answer"):
            self.assertNotIn(absent, by_name)
        self.assertIsNone(self.run_ok(sb, "y = 1").locals)  # only when asked

    def test_fetch_one_variable(self) -> None:
        sb = self.sandbox()
        result = self.run_ok(sb, "data = {'a': [1, 2], 'b': None}\nobj = object()",
                             fetch="data")
        self.assertEqual(result.fetched, {"value": {"a": [1, 2], "b": None}})
        self.assertTrue(self.run_ok(sb, "", fetch="obj").fetched["value"].startswith(
            "<object object at"))
        self.assertIn("error", self.run_ok(sb, "", fetch="missing").fetched)
        self.assertIsNone(self.run_ok(sb, "z = 1").fetched)


class AddContextTest(SandboxTestCase):
    def test_contexts_of_each_kind(self) -> None:
        sb = self.sandbox(context="first")
        self.assertEqual(sb.add_context({"k": [1, 2]}), 1)
        self.assertEqual(sb.add_context(["x", "y"]), 2)
        result = self.run_ok(sb, "print(context, context_0, context_1['k'], context_2)")
        self.assertEqual(result.stdout, "first first [1, 2] ['x', 'y']\n")
        self.assertEqual(sb.add_context("replaced", index=0), 0)
        self.assertEqual(self.run_ok(sb, "print(context, context_0)").stdout,
                         "replaced replaced\n")

    def test_a_large_context_goes_through_a_file(self) -> None:
        sb = self.sandbox()
        big = "é" * (3 << 20)  # 6 MiB of UTF-8: through a file, not JSON-escaped into a line
        self.assertEqual(sb.add_context(big), 0)
        deep: Any = 0
        for _ in range(100):
            deep = [deep]
        self.assertEqual(sb.add_context(deep), 1)
        result = self.run_ok(sb, "d, v = 0, context_1\nwhile isinstance(v, list):\n"
                                 "    d, v = d + 1, v[0]\nprint(len(context), context[:2], d)")
        self.assertEqual(result.stdout, "3145728 éé 100\n")

    def test_added_context_survives_a_rollback(self) -> None:
        sb = self.sandbox()
        self.assertEqual(sb.add_context("kept"), 0)
        result = sb.execute("context = None\nwhile True:\n    pass", timeout=1)
        self.assertEqual(result.status, "timeout")
        self.assertEqual(self.run_ok(sb, "print(context)").stdout, "kept\n")

    def test_history(self) -> None:
        sb = self.sandbox()
        turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        self.assertEqual(sb.add_history(turn), 0)
        self.assertEqual(sb.add_history(turn + turn), 1)
        result = self.run_ok(sb, "print(history == history_0, len(history_1), "
                                 "history[1]['content'])")
        self.assertEqual(result.stdout, "True 4 a\n")


class CellResultTest(unittest.TestCase):
    def test_new_fields_from_json(self) -> None:
        raw: Dict[str, Any] = {"status": "ok", "answer": {"content": "done"},
                               "locals": [{"name": "x", "type": "int", "repr": "1"}],
                               "fetched": {"value": [1]}, "index": 2,
                               "saved": {"bytes": 10, "skipped": []}}
        result = CellResult.from_json(raw)
        self.assertEqual((result.answer, result.locals, result.fetched, result.index,
                          result.saved),
                         ("done", raw["locals"], {"value": [1]}, 2, {"bytes": 10, "skipped": []}))
        empty = CellResult.from_json({"status": "ok", "saved": "not an object"})
        self.assertEqual((empty.answer, empty.locals, empty.fetched, empty.index, empty.saved),
                         (None, None, None, None, None))
        self.assertEqual(json.loads(json.dumps(result.raw)), raw)


if __name__ == "__main__":
    unittest.main()
