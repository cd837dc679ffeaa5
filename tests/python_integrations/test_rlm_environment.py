"""Contract tests for rlm_sandbox.integrations.rlm.RlmSandboxREPL against the real sandbox.

Written from the RLM library's environment interface (BaseEnv, SupportsPersistence, the LM
handler protocol, LocalREPL's behaviour): what its completion loop relies on. The library is
not needed (nor imported, unless installed); its LM handler is played by ``FakeLMHandler``.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_rlm_environment``
from tests/python_integrations (ctest's ``python_integrations`` test does this).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import types
import unittest
from typing import Any, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from _fakes import SANDBOX, FakeLMHandler, require_binary  # noqa: E402
from rlm_sandbox import RlmSandboxError  # noqa: E402
from rlm_sandbox.integrations import rlm as rlm_env  # noqa: E402
from rlm_sandbox.integrations.rlm import RlmSandboxREPL  # noqa: E402



setUpModule = require_binary  # noqa: N816 - unittest's name


def make_env(**kwargs: Any) -> RlmSandboxREPL:
    return RlmSandboxREPL(**{**SANDBOX, **kwargs})


def pid_alive(pid: Optional[int]) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Completion:
    """What the library's subcall_fn returns (only ``response`` is read)."""

    def __init__(self, response: str) -> None:
        self.response = response


class ReplResultShape(unittest.TestCase):
    def setUp(self) -> None:
        self.env = make_env()
        self.addCleanup(self.env.cleanup)

    def test_execute_code_fills_every_field(self) -> None:
        result = self.env.execute_code("x = 6 * 7\nwords = ['a', 'b']\nprint('hello', x)")
        self.assertEqual(result.stdout, "hello 42\n")
        self.assertEqual(result.stderr, "")
        self.assertEqual(result.locals.get("x"), 42)  # LocalREPL's locals hold the values
        self.assertEqual(result.locals.get("words"), ["a", "b"])
        self.assertGreater(result.execution_time, 0)
        self.assertEqual(result.rlm_calls, [])
        self.assertIsNone(result.final_answer)

    def test_no_echo_of_a_trailing_expression_as_with_exec(self) -> None:
        self.assertEqual(self.env.execute_code("1 + 1").stdout, "")

    def test_state_persists_and_exception_goes_to_stderr(self) -> None:
        self.env.execute_code("kept = 'yes'")
        result = self.env.execute_code("print('before')\n1 / 0")
        self.assertEqual(result.stdout, "before\n")
        self.assertIn("ZeroDivisionError", result.stderr)
        self.assertEqual(self.env.execute_code("print(kept)").stdout, "yes\n")

    def test_answer_ready_is_the_final_answer_once(self) -> None:
        result = self.env.execute_code("answer['content'] = 6 * 7\nanswer['ready'] = True")
        self.assertEqual(result.final_answer, "42")
        self.assertIsNone(self.env.execute_code("pass").final_answer)

    def test_answer_rebound_to_a_plain_dict_still_finishes(self) -> None:
        result = self.env.execute_code("answer = {'content': 'plain', 'ready': True}")
        self.assertEqual(result.final_answer, "plain")

    def test_older_finishers_final_var_prints_its_value(self) -> None:
        result = self.env.execute_code("x = 'the value'\nprint(FINAL_VAR('x'))")
        self.assertEqual(result.stdout, "the value\n")
        self.assertEqual(result.final_answer, "the value")
        self.assertEqual(self.env.execute_code("FINAL(7)").final_answer, "7")

    def test_reserved_names_are_restored_after_a_cell(self) -> None:
        self.env.load_context("the context")
        self.env.execute_code("llm_query = None\ncontext = 1\nanswer = 3")
        result = self.env.execute_code(
            "print(callable(llm_query), context, answer['ready'])")
        self.assertEqual(result.stdout, "True the context False\n")

    def test_show_vars_lists_the_variables(self) -> None:
        self.env.execute_code("alpha = 1")
        result = self.env.execute_code("print(SHOW_VARS())")
        self.assertIn("Available variables:", result.stdout)
        self.assertIn("'alpha': 'int'", result.stdout)

    def test_setup_code_runs_first(self) -> None:
        env = make_env(setup_code="import math\nradius = 2")
        self.addCleanup(env.cleanup)
        self.assertEqual(env.execute_code("print(round(math.pi * radius ** 2, 2))").stdout,
                         "12.57\n")

    def test_locals_mapping_reads_values_from_the_session(self) -> None:
        self.env.load_context("First")
        self.env.execute_code("total = 6 * 100\nitems = [1, 'a']\n"
                              "class K:\n    pass\nk = K()")
        variables = self.env.locals
        self.assertEqual(variables["total"], 600)
        self.assertEqual(variables["items"], [1, "a"])
        self.assertEqual(variables["context_0"], "First")
        self.assertTrue(variables["k"].startswith("<"), variables["k"])  # not JSON: its repr
        self.assertIn("total", variables)
        self.assertNotIn("missing", variables)
        with self.assertRaises(KeyError):
            variables["missing"]  # noqa: B018 - the lookup is the test
        self.assertLessEqual({"total", "items", "k"}, set(variables))

    def test_stand_in_result_has_the_library_fields(self) -> None:
        result = self.env.execute_code("print(1)")
        data = result.to_dict()
        for key in ("stdout", "stderr", "locals", "execution_time", "rlm_calls",
                    "final_answer"):
            self.assertIn(key, data)


class LmCalls(unittest.TestCase):
    def test_llm_query_reaches_the_handler_with_depth_and_model(self) -> None:
        with FakeLMHandler(lambda p, m, d: f"echo:{p}:{m}:{d}") as handler:
            env = make_env(lm_handler_address=handler.address, depth=2)
            self.addCleanup(env.cleanup)
            result = env.execute_code("print(llm_query('ping'))\n"
                                      "print(llm_query('pong', model='small'))")
        self.assertEqual(result.stdout, "echo:ping:None:2\necho:pong:small:2\n")
        self.assertEqual([c.response for c in result.rlm_calls],
                         ["echo:ping:None:2", "echo:pong:small:2"])
        self.assertEqual(sorted(r["prompt"] for r in handler.requests), ["ping", "pong"])

    def test_message_list_prompt_arrives_as_a_list(self) -> None:
        seen: List[Any] = []
        with FakeLMHandler(lambda p, m, d: (seen.append(p), "ok")[1]) as handler:
            env = make_env(lm_handler_address=handler.address)
            self.addCleanup(env.cleanup)
            env.execute_code("r = llm_query([{'role': 'user', 'content': 'hi'}])")
        self.assertEqual(seen, [[{"role": "user", "content": "hi"}]])

    def test_batched_keeps_order_and_fails_per_item(self) -> None:
        def respond(prompt: Any, model: Any, depth: int) -> str:
            if prompt == "bad":
                raise ValueError("no such luck")
            time.sleep(0.05 if prompt == "p0" else 0)
            return prompt.upper()

        with FakeLMHandler(respond) as handler:
            env = make_env(lm_handler_address=handler.address)
            self.addCleanup(env.cleanup)
            result = env.execute_code("r = llm_query_batched(['p0', 'bad', 'p2'])\n"
                                      "print(r[0], r[2])\nprint(r[1])")
        first, second = result.stdout.splitlines()
        self.assertEqual(first, "P0 P2")
        self.assertTrue(second.startswith("Error: "), second)
        self.assertIn("no such luck", second)
        self.assertEqual(len(result.rlm_calls), 2)

    def test_without_a_handler_llm_query_returns_the_library_error_text(self) -> None:
        env = make_env()
        self.addCleanup(env.cleanup)
        self.assertEqual(env.execute_code("print(llm_query('x'))").stdout,
                         "Error: No LM handler configured\n")

    def test_update_handler_address_moves_the_calls(self) -> None:
        with FakeLMHandler(lambda p, m, d: "first") as one, \
                FakeLMHandler(lambda p, m, d: "second") as two:
            env = make_env(lm_handler_address=one.address, persistent=True)
            self.addCleanup(env.cleanup)
            self.assertEqual(env.execute_code("print(llm_query('a'))").stdout, "first\n")
            env.update_handler_address(two.address)
            self.assertEqual(env.execute_code("print(llm_query('a'))").stdout, "second\n")

    def test_rlm_query_goes_through_subcall_fn_capped(self) -> None:
        lock = threading.Lock()
        state = {"now": 0, "most": 0}
        prompts: List[Any] = []

        def subcall(prompt: Any, model: Optional[str]) -> Completion:
            with lock:
                prompts.append((prompt, model))
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(0.2)
            with lock:
                state["now"] -= 1
            return Completion(f"child:{prompt}")

        env = make_env(subcall_fn=subcall, max_concurrent_subcalls=2)
        self.addCleanup(env.cleanup)
        result = env.execute_code("print(rlm_query('solo', model='m'))\n"
                                  "print(rlm_query_batched(['a', 'b', 'c', 'd']))")
        self.assertEqual(result.stdout,
                         "child:solo\n['child:a', 'child:b', 'child:c', 'child:d']\n")
        self.assertIn(("solo", "m"), prompts)
        self.assertLessEqual(state["most"], 2)
        self.assertEqual(len(result.rlm_calls), 5)

    def test_batched_rlm_query_reaches_subcall_fn_and_rlm_calls_in_prompt_order(self) -> None:
        # As LocalREPL: the subcalls start in prompt order, and their records are in prompt
        # order though they finish in reverse (each sleeps less than the one before).
        started: List[str] = []
        lock = threading.Lock()

        def subcall(prompt: Any, model: Optional[str]) -> Completion:
            with lock:
                started.append(prompt)
            time.sleep(0.02 * (8 - int(prompt[1:])))
            return Completion(f"child:{prompt}")

        env = make_env(subcall_fn=subcall, max_concurrent_subcalls=8)
        self.addCleanup(env.cleanup)
        prompts = [f"p{i}" for i in range(8)]
        for _ in range(3):
            started.clear()
            result = env.execute_code(f"r = rlm_query_batched({prompts!r})\nprint(r[0], r[7])")
            self.assertEqual(result.stdout, "child:p0 child:p7\n")
            self.assertEqual(started, prompts)
            self.assertEqual([call.response for call in result.rlm_calls],
                             [f"child:{p}" for p in prompts])

    def test_rlm_query_failure_is_error_text(self) -> None:
        def subcall(prompt: Any, model: Optional[str]) -> Completion:
            raise RuntimeError("child broke")

        env = make_env(subcall_fn=subcall)
        self.addCleanup(env.cleanup)
        self.assertEqual(env.execute_code("print(rlm_query('x'))").stdout,
                         "Error: RLM query failed - child broke\n")

    def test_rlm_query_without_subcall_fn_is_an_llm_query(self) -> None:
        with FakeLMHandler(lambda p, m, d: f"lm:{p}") as handler:
            env = make_env(lm_handler_address=handler.address)
            self.addCleanup(env.cleanup)
            self.assertEqual(env.execute_code("print(rlm_query('q'))").stdout, "lm:q\n")


class LocalReplDropIn(unittest.TestCase):
    """Where a cell sees what it would see in LocalREPL."""

    def setUp(self) -> None:
        self.env = make_env()
        self.addCleanup(self.env.cleanup)

    def test_without_a_context_context_is_a_name_error(self) -> None:
        result = self.env.execute_code("print(context)")
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr, "\nNameError: name 'context' is not defined")

    def test_errors_are_written_as_localrepl_writes_them(self) -> None:
        for code, expected in (
                ("1 / 0", "\nZeroDivisionError: division by zero"),
                ("def f():\n    return g()\nf()", "\nNameError: name 'g' is not defined"),
                ("raise ValueError('two\\nlines')", "\nValueError: two\nlines"),
                ("try:\n    1 / 0\nexcept Exception:\n    raise KeyError('k')",
                 "\nKeyError: 'k'")):
            self.assertEqual(self.env.execute_code(code).stderr, expected, code)
        printed = self.env.execute_code("import sys\nprint('w', file=sys.stderr)\n[][0]")
        self.assertEqual(printed.stderr, "w\n\nIndexError: list index out of range")
        self.assertTrue(self.env.execute_code("1 +").stderr.startswith("\nSyntaxError: "))

    def test_llm_query_of_a_non_str_answers_error_text(self) -> None:
        result = self.env.execute_code("r = llm_query(123)\nprint(r)\n"
                                       "print(llm_query_batched(['a', None])[1])")
        self.assertEqual(result.stderr, "")
        self.assertEqual(result.stdout,
                         "Error: prompt must be a str or a list of messages, not int\n"
                         "Error: a batched prompt must be a str, not NoneType\n")

    def test_locals_carry_small_values_and_reprs_of_the_rest(self) -> None:
        result = self.env.execute_code("n = 3\nd = {'b': [1, (2, 3)], 'a': None}\n"
                                       "big = list(range(1000))\nclass K:\n    pass\n")
        self.assertEqual(result.locals["n"], 3)
        self.assertEqual(result.locals["d"], {"b": [1, [2, 3]], "a": None})
        self.assertTrue(result.locals["big"].startswith("[0, 1, 2"), result.locals["big"])
        self.assertIn("class", result.locals["K"])


class CustomTools(unittest.TestCase):
    def test_callable_tool_runs_on_the_host_and_data_tool_is_a_value(self) -> None:
        host_threads: List[str] = []

        def lookup(key: str, default: str = "?") -> dict:
            host_threads.append(threading.current_thread().name)
            return {"key": key, "found": {"a": 1}.get(key, default)}

        env = make_env(custom_tools={
            "lookup": {"tool": lookup, "description": "finds a key"},
            "LIMITS": {"max": 3}})
        self.addCleanup(env.cleanup)
        result = env.execute_code("a, b = lookup('a'), lookup('b', default='none')\n"
                                  "print(a['key'], a['found'], b['key'], b['found'])\n"
                                  "print(LIMITS['max'])")
        self.assertEqual(result.stdout, "a 1 b none\n3\n")
        self.assertEqual(len(host_threads), 2)

    def test_tool_exception_raises_in_the_cell_as_its_own_type(self) -> None:
        class NotFound(LookupError):
            pass

        def broken(kind: str) -> None:
            if kind == "key":
                raise KeyError("missing thing")
            if kind == "os":
                raise FileNotFoundError(2, "No such file", "/x")
            raise NotFound("own type")

        env = make_env(custom_tools={"broken": broken})
        self.addCleanup(env.cleanup)
        result = env.execute_code(
            "for kind in ('key', 'os', 'own'):\n"
            "    try:\n        broken(kind)\n"
            "    except LookupError as e:\n        print(type(e).__name__, repr(e))\n"
            "    except OSError as e:\n        print(type(e).__name__, e.errno, e.strerror)\n")
        self.assertEqual(result.stdout, "KeyError KeyError('missing thing')\n"
                                        "FileNotFoundError 2 No such file\n"
                                        "NotFound NotFound('own type')\n")
        # Uncaught: stderr as LocalREPL writes it.
        self.assertEqual(env.execute_code("broken('key')").stderr,
                         "\nKeyError: 'missing thing'")

    def test_python_values_cross_both_ways_in_order(self) -> None:
        seen: List[Any] = []

        def echo(*args: Any, **kwargs: Any) -> Any:
            seen.append((args, kwargs))
            return {"z": args, "a": kwargs, (1, 2): {b"x", 3.5}}

        env = make_env(custom_tools={"echo": echo, "table": {"z": (1, 2), 5: b"\x00"}})
        self.addCleanup(env.cleanup)
        result = env.execute_code(
            "r = echo((1, 'a'), {2, 3}, k=frozenset([1]), n=float('inf'), b=bytearray(b'q'))\n"
            "print(list(r), r['z'], r[(1, 2)] == {b'x', 3.5})\n"
            "print(list(table), table)")
        self.assertEqual(result.stderr, "")
        self.assertEqual(result.stdout,
                         "['z', 'a', (1, 2)] ((1, 'a'), {2, 3}) True\n"
                         "['z', 5] {'z': (1, 2), 5: b'\\x00'}\n")
        self.assertEqual(seen, [(((1, "a"), {2, 3}), {"k": frozenset([1]), "n": float("inf"),
                                                      "b": bytearray(b"q")})])

    def test_a_cell_cannot_make_the_host_hash_colliding_keys_without_bound(self) -> None:
        # Ints hash to themselves modulo 2**61 - 1: multiples of it all collide, and each set
        # insertion would scan the others. The host takes at most 4,096 such keys per call.
        sizes: List[int] = []
        env = make_env(custom_tools={"count": lambda items: sizes.append(len(items)) or 0})
        self.addCleanup(env.cleanup)
        modulus = (1 << 61) - 1
        taken = env.execute_code(f"count({{k * {modulus} for k in range(1, 4001)}})")
        self.assertEqual(taken.stderr, "")
        refused = env.execute_code(f"count({{k * {modulus} for k in range(1, 50001)}})")
        self.assertIn("RuntimeError: tool 'count': arguments that are not encoded values (a "
                      "value from the sandbox holds more than 4096 set items", refused.stderr)
        self.assertEqual(sizes, [4000])

    def test_values_no_encoding_takes_fail_in_the_cell_not_the_constructor(self) -> None:
        class Frame:  # stands for a DataFrame, an open file...
            pass

        env = make_env(custom_tools={"make": lambda: Frame(), "take": lambda x: x,
                                     "frame": Frame()})
        self.addCleanup(env.cleanup)
        made = env.execute_code("make()")
        self.assertIn("TypeError: tool 'make' returned a value of type Frame cannot be sent",
                      made.stderr)
        taken = env.execute_code("take(object())")
        self.assertIn("TypeError: the arguments of take must be values a tool can take",
                      taken.stderr)
        used = env.execute_code("frame.columns")
        self.assertIn("TypeError: the value of frame could not be sent to the sandbox: a value "
                      "of type Frame cannot be sent", used.stderr)
        self.assertEqual(env.execute_code("print(1)").stdout, "1\n")

    def test_reserved_names_are_refused(self) -> None:
        with self.assertRaises(ValueError):
            make_env(custom_tools={"llm_query": len})
        with self.assertRaises(ValueError):
            make_env(custom_tools={"answer": 1})


class Persistence(unittest.TestCase):
    def setUp(self) -> None:
        self.env = make_env(context_payload="first document", persistent=True)
        self.addCleanup(self.env.cleanup)

    def test_contexts_are_versioned_and_context_is_context_0(self) -> None:
        self.assertEqual(self.env.get_context_count(), 1)
        self.assertEqual(self.env.add_context({"k": [1, 2]}), 1)
        self.assertEqual(self.env.add_context(["x", "y"]), 2)
        self.assertEqual(self.env.get_context_count(), 3)
        result = self.env.execute_code(
            "print(context == context_0, context_0)\n"
            "print(context_1['k'], type(context_1).__name__, context_2)")
        self.assertEqual(result.stdout,
                         "True first document\n[1, 2] dict ['x', 'y']\n")

    def test_explicit_index_replaces_that_context(self) -> None:
        self.assertEqual(self.env.add_context("replaced", 0), 0)
        self.assertEqual(self.env.get_context_count(), 1)
        self.assertEqual(self.env.execute_code("print(context)").stdout, "replaced\n")

    def test_histories_are_versioned_copies(self) -> None:
        messages = [{"role": "user", "content": "hi"}]
        self.assertEqual(self.env.add_history(messages), 0)
        messages.append({"role": "assistant", "content": "changed later"})
        self.assertEqual(self.env.add_history([{"role": "user", "content": "two"}]), 1)
        self.assertEqual(self.env.get_history_count(), 2)
        result = self.env.execute_code(
            "print(len(history), history is history_0, history_1[0]['content'])")
        self.assertEqual(result.stdout, "1 True two\n")

    def test_dicts_keep_their_key_order_as_in_localrepl(self) -> None:
        added = self.env.add_context({"zeta": 1, "alpha": {"y": 2, "b": 3}})
        history = self.env.add_history([{"role": "user", "content": "hi", "name": "n"}])
        result = self.env.execute_code(
            f"print(list(context_{added}), list(context_{added}['alpha']), "
            f"list(history_{history}[0]))")
        self.assertEqual(result.stdout,
                         "['zeta', 'alpha'] ['y', 'b'] ['role', 'content', 'name']\n")

    def test_added_context_survives_a_rolled_back_cell(self) -> None:
        env = make_env(timeout=1)
        self.addCleanup(env.cleanup)
        env.add_context("kept text")
        result = env.execute_code("while True:\n    pass")
        self.assertIn("TimeoutError", result.stderr)
        self.assertEqual(env.execute_code("print(context)").stdout, "kept text\n")

    def test_compaction_entries_make_the_history_list(self) -> None:
        env = make_env(compaction=True)
        self.addCleanup(env.cleanup)
        self.assertEqual(env.execute_code("print(history)").stdout, "[]\n")
        env.append_compaction_entry([{"role": "user", "content": "segment"}])
        env.append_compaction_entry({"type": "summary", "content": "so far"})
        self.assertEqual(env.execute_code("print(len(history), history[1]['content'])").stdout,
                         "2 so far\n")

    def test_save_and_load_carry_the_state_and_the_counts(self) -> None:
        directory = tempfile.mkdtemp(prefix="rlm-env-save-")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "turn.save")
        self.env.add_context("second document")
        self.env.add_history([{"role": "user", "content": "hi"}])
        self.env.execute_code("def shout(s):\n    return s.upper()\nnotes = shout(context_1)\n"
                              "lines = (c for c in notes)")
        saved = self.env.save(path)
        self.assertEqual(saved.status, "ok", saved)
        self.assertEqual([item["name"] for item in saved.saved["skipped"]], ["lines"])
        other = make_env()
        self.addCleanup(other.cleanup)
        self.assertEqual((other.get_context_count(), other.get_history_count()), (0, 0))
        self.assertTrue(other.load(path).ok)
        self.assertEqual((other.get_context_count(), other.get_history_count()), (2, 1))
        result = other.execute_code("print(notes, shout(context), history[0]['content'])")
        self.assertEqual(result.stdout, "SECOND DOCUMENT FIRST DOCUMENT hi\n")
        self.assertEqual(other.add_context("third"), 2)
        with open(path, "r+b") as damaged:
            damaged.seek(os.path.getsize(path) // 2)
            byte = damaged.read(1)
            damaged.seek(-1, os.SEEK_CUR)
            damaged.write(bytes([byte[0] ^ 1]))
        with self.assertRaisesRegex(RlmSandboxError, "SHA-256"):
            other.load(path)
        self.assertEqual(other.get_context_count(), 3)

    def test_supports_the_persistence_protocol_methods(self) -> None:
        for name in ("update_handler_address", "add_context", "get_context_count",
                     "add_history", "get_history_count"):
            self.assertTrue(callable(getattr(self.env, name)), name)


class Fork(unittest.TestCase):
    """RlmSandboxREPL.fork(n): n environments holding the state, for best-of-N."""

    def branches_of(self, env: RlmSandboxREPL, n: int) -> List[RlmSandboxREPL]:
        branches = env.fork(n)
        for branch in branches:
            self.addCleanup(branch.cleanup)
        return branches

    def test_best_of_n_each_branch_runs_its_own_code_on_the_state(self) -> None:
        with FakeLMHandler(lambda prompt, model, depth: f"answer:{prompt}:{depth}") as handler:
            env = make_env(context_payload="first document", persistent=True, depth=2,
                           lm_handler_address=("127.0.0.1", 9),  # moved before the fork
                           custom_tools={"double": lambda v: 2 * v})
            self.addCleanup(env.cleanup)
            env.update_handler_address(handler.address)
            env.add_context("second document")
            env.add_history([{"role": "user", "content": "hi"}])
            env.execute_code("def shout(s):\n    return s.upper()\nscores = []\n"
                             "open('/tmp/notes.txt', 'w').write('parent')")
            branches = self.branches_of(env, 3)
            self.assertEqual([type(branch) for branch in branches], [RlmSandboxREPL] * 3)
            self.assertEqual([(branch.get_context_count(), branch.get_history_count())
                              for branch in branches], [(2, 1)] * 3)
            candidates = [f"scores.append({i})\nbest = shout(context_1) + ' {i}'\n"
                          f"open('/tmp/notes.txt', 'w').write(best)\n"
                          f"print(best, double({i}), llm_query('q{i}'))" for i in range(3)]
            results = [branch.execute_code(code) for branch, code in zip(branches, candidates)]
            self.assertEqual(env.execute_code("pass").rlm_calls, [])  # each records its own
        for i, result in enumerate(results):
            self.assertEqual(result.stdout, f"SECOND DOCUMENT {i} {2 * i} answer:q{i}:2\n")
            self.assertEqual([call.response for call in result.rlm_calls], [f"answer:q{i}:2"])
            self.assertEqual(result.locals["scores"], [i])
        check = "print(scores, open('/tmp/notes.txt').read(), history[0]['content'])"
        for i, branch in enumerate(branches):
            self.assertEqual(branch.execute_code(check).stdout, f"[{i}] SECOND DOCUMENT {i} hi\n")
        self.assertEqual(env.execute_code(check).stdout, "[] parent hi\n")
        # Each environment counts its own contexts from here on.
        self.assertEqual(branches[0].add_context("third of branch 0"), 2)
        self.assertEqual((branches[1].get_context_count(), env.get_context_count()), (2, 2))
        self.assertEqual(env.add_context("third of the parent"), 2)
        self.assertEqual(branches[1].execute_code("print('context_2' in globals())").stdout,
                         "False\n")
        self.assertEqual(branches[0].execute_code("print(context_2)").stdout,
                         "third of branch 0\n")

    def test_counts_come_from_the_state_and_compaction_entries_go_on(self) -> None:
        env = make_env(compaction=True)
        self.addCleanup(env.cleanup)
        env.append_compaction_entry({"type": "summary", "content": "so far"})
        env.execute_code("context_4 = 'made by a cell'")
        (branch,) = self.branches_of(env, 1)
        self.assertEqual((branch.get_context_count(), branch.get_history_count()), (5, 0))
        branch.append_compaction_entry({"type": "summary", "content": "in the branch"})
        self.assertEqual(branch.execute_code("print([e['content'] for e in history])").stdout,
                         "['so far', 'in the branch']\n")
        self.assertEqual(env.execute_code("print(len(history))").stdout, "1\n")

    def test_branches_outlive_the_parent_and_a_refused_count_forks_nothing(self) -> None:
        env = make_env()
        env.execute_code("kept = 7")
        for count in (0, 65):
            with self.assertRaises(ValueError):
                env.fork(count)
        first, second = self.branches_of(env, 2)
        env.cleanup()
        with self.assertRaises(RuntimeError):
            env.fork(1)
        self.assertEqual(first.execute_code("kept += 1\nprint(kept)").stdout, "8\n")
        first.cleanup()
        self.assertEqual(second.execute_code("print(kept)").stdout, "7\n")


class Lifecycle(unittest.TestCase):
    def test_runaway_cell_ends_at_the_timeout_and_the_session_goes_on(self) -> None:
        env = make_env(timeout=1)
        self.addCleanup(env.cleanup)
        env.execute_code("before = 1")
        started = time.monotonic()
        result = env.execute_code("after = 2\nwhile True:\n    pass")
        self.assertLess(time.monotonic() - started, 30)
        self.assertIn("TimeoutError", result.stderr)
        self.assertEqual(env.execute_code("print(before, 'after' in globals())").stdout,
                         "1 False\n")

    def test_cleanup_ends_the_sandbox_and_is_idempotent(self) -> None:
        env = make_env()
        pid = env._sandbox.pid
        self.assertTrue(pid_alive(pid))
        env.cleanup()
        env.cleanup()
        self.assertFalse(pid_alive(pid))
        self.assertEqual(len(env.locals), 0)  # as LocalREPL's cleared namespace
        with self.assertRaises(RuntimeError):
            env.execute_code("1")

    def test_context_manager_cleans_up(self) -> None:
        with make_env() as env:
            pid = env._sandbox.pid
        self.assertFalse(pid_alive(pid))


class Registration(unittest.TestCase):
    """register() / sandboxed() against a stand-in of the library's module layout."""

    def setUp(self) -> None:
        self.saved = {name: sys.modules.get(name)
                      for name in ("rlm", "rlm.core", "rlm.core.rlm", "rlm.environments")}
        self.calls: List[Any] = []

        def original(environment: str, kwargs: dict) -> Any:
            self.calls.append(environment)
            return ("library", environment)

        package = types.ModuleType("rlm")
        core = types.ModuleType("rlm.core")
        core_rlm = types.ModuleType("rlm.core.rlm")
        environments = types.ModuleType("rlm.environments")
        self.original = original
        core_rlm.get_environment = original
        environments.get_environment = original
        recorded = self.recorded = []

        class RLM:  # the library's constructor signature, as far as register() reads it
            def __init__(self, backend: str = "openai", backend_kwargs: Any = None,
                         environment: str = "local", environment_kwargs: Any = None,
                         depth: int = 0, max_depth: int = 1, persistent: bool = False) -> None:
                recorded.append((environment, environment_kwargs, persistent))

        core_rlm.RLM = RLM
        package.core, core.rlm, package.environments = core, core_rlm, environments
        sys.modules.update({"rlm": package, "rlm.core": core, "rlm.core.rlm": core_rlm,
                            "rlm.environments": environments})
        self.core_rlm = core_rlm

        def restore() -> None:
            for name, module in self.saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
        self.addCleanup(restore)

    def test_routes_the_name_and_the_kwargs_key_and_nothing_else(self) -> None:
        kwargs = rlm_env.sandboxed(**SANDBOX)
        rlm_env.register()  # idempotent: still one router
        route = self.core_rlm.get_environment
        self.assertIs(route.__wrapped__, self.original)  # wrapped once, not twice
        self.assertEqual(route("local", {"depth": 1}), ("library", "local"))
        env = route("local", dict(kwargs, depth=3, context_payload="ctx"))
        self.addCleanup(env.cleanup)
        self.assertIsInstance(env, RlmSandboxREPL)
        self.assertEqual(env.depth, 3)
        self.assertEqual(env.execute_code("print(context)").stdout, "ctx\n")
        named = route("rlm_sandbox", dict(SANDBOX))
        self.addCleanup(named.cleanup)
        self.assertIsInstance(named, RlmSandboxREPL)
        self.assertEqual(self.calls, ["local"])

    def test_the_name_is_wired_as_local_for_child_rlms_and_persistence(self) -> None:
        # The library passes rlm_query's callback, and takes persistent=True, only for the
        # environments it knows: "rlm_sandbox" becomes "local" with the routing key.
        rlm_env.register()
        rlm_env.register()
        library_rlm = self.core_rlm.RLM
        self.assertFalse(getattr(library_rlm.__init__.__wrapped__, "rlm_sandbox_router", False))
        library_rlm(environment="rlm_sandbox", environment_kwargs={"timeout": 5},
                    persistent=True)
        library_rlm("openai", None, "rlm_sandbox")
        library_rlm(environment="local", environment_kwargs={"x": 1})
        self.assertEqual(self.recorded, [
            ("local", {"timeout": 5, "rlm_sandbox": {}}, True),
            ("local", {"rlm_sandbox": {}}, False),
            ("local", {"x": 1}, False)])

    def test_unknown_option_is_refused(self) -> None:
        with self.assertRaises(TypeError):
            rlm_env.sandboxed(colour="blue")


if __name__ == "__main__":
    unittest.main()
