"""Acceptance: a whole scripted RLM run through rlm_sandbox.integrations.rlm.

The loop has the RLM library's shape (``_fakes.run_completion``): a model (scripted) answers
with ```repl blocks, each block runs in the environment, the run ends when a cell sets
``answer["ready"]``; sub-calls go to an LM handler over the library's socket protocol
(``FakeLMHandler``) and ``rlm_query`` to a child run with its own sandboxed environment, as
the library's ``subcall_fn`` does. The context is 5 MB. One cell runs away
(``while True: pass``): it ends at the time limit and the loop goes on. A second,
persistent turn adds a context and the first turn's history to the same live session.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_rlm_loop``.
"""

from __future__ import annotations

import os
import re
import sys
import unittest
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from _fakes import (  # noqa: E402
    SANDBOX, FakeLMHandler, ScriptedLM, require_binary, run_completion)
from rlm_sandbox.integrations.rlm import RlmSandboxREPL  # noqa: E402

SECRET = "7731"


setUpModule = require_binary  # noqa: N816 - unittest's name


def make_document() -> str:
    """5 MiB of numbered filler lines with one line holding the secret, past the middle."""
    lines = [f"line {i:07d}: nothing to see in this part of the record, move along."
             for i in range(80_000)]
    lines[51_234] = f"line 0051234: the secret code is {SECRET}, keep it safe."
    text = "\n".join(lines)
    assert len(text) >= 5 << 20, len(text)
    return text


def sub_lm(prompt: Any, model: Optional[str], depth: int) -> str:
    """The sub-LM behind llm_query: finds a code in a chunk; confirms a code it is shown."""
    text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
    if text.startswith("verify:"):
        return "confirmed" if SECRET in text else "wrong"
    found = re.search(r"secret code is (\d+)", text)
    return f"FOUND {found.group(1)}" if found else "NONE"


ROOT_TURNS = [
    # 1: look at the context, split it.
    "Let me look at the context first.\n```repl\n"
    "print(type(context).__name__, len(context))\n"
    "chunks = [context[i:i + 1_000_000] for i in range(0, len(context), 1_000_000)]\n"
    "print(len(chunks), 'chunks')\n```",
    # 2: a runaway cell (a bug the model wrote): it must end, and the run go on.
    "Now count the lines, slowly.\n```repl\n"
    "n = 0\nwhile True:\n    n += 1\n```",
    # 3: ask the sub-LM about every chunk at once.
    "That timed out; ask the sub-LM instead.\n```repl\n"
    "hits = llm_query_batched([f'Find the secret code in: {c}' for c in chunks])\n"
    "found = [h.split()[1] for h in hits if h.startswith('FOUND')]\n"
    "print(found, 'n' in globals())\n```",
    # 4: verify with a recursive sub-RLM, then answer.
    "Verify with a sub-RLM and answer.\n```repl\n"
    "verdict = rlm_query(f'Is {found[0]} the secret code?')\n"
    "print(verdict)\n"
    "answer['content'] = found[0]\n"
    "answer['ready'] = verdict == 'confirmed'\n```",
]

CHILD_TURNS = [
    "```repl\nverdict = llm_query('verify: ' + context)\n"
    "answer['content'] = verdict\nanswer['ready'] = True\n```",
]

FOLLOW_UP_TURNS = [
    # turn 2, 1: the new context, the stored history and the old variables are all there.
    "```repl\nprint(context_1['question'], len(history), history[1]['content'][:20])\n"
    "print(found, len(chunks), len(context))\n```",
    # turn 2, 2: answer.
    "```repl\nanswer['content'] = f\"{context_1['question']} {found[0]}\"\n"
    "answer['ready'] = True\n```",
]


class ScriptedRlmRun(unittest.TestCase):
    def test_whole_run_two_persistent_turns(self) -> None:
        child_runs = []

        def subcall(prompt: Any, model: Optional[str]) -> Any:
            """As the library's RLM._subcall: a child run with its own environment."""
            child = RlmSandboxREPL(lm_handler_address=env.lm_handler_address,
                                   context_payload=prompt, depth=2, timeout=5, **SANDBOX)
            try:
                final, _, results = run_completion(child, ScriptedLM(list(CHILD_TURNS)),
                                                   "verify it")
            finally:
                child.cleanup()
            child_runs.append((prompt, final, results))

            class Completion:
                response = final
            return Completion()

        document = make_document()
        with FakeLMHandler(sub_lm) as handler:
            env = RlmSandboxREPL(lm_handler_address=handler.address, context_payload=document,
                                 persistent=True, subcall_fn=subcall, depth=1, timeout=3,
                                 **SANDBOX)
            self.addCleanup(env.cleanup)
            model = ScriptedLM(list(ROOT_TURNS))
            final, messages, results = run_completion(env, model, "What is the secret code?")

        self.assertEqual(final, SECRET)
        self.assertEqual(model.turns, [])  # every turn was used: the run did not stop early
        first, runaway, batched, verify = results
        self.assertEqual(first.stdout, f"str {len(document)}\n6 chunks\n")
        # The runaway cell ended at the time limit, was rolled back, and the loop went on:
        self.assertIn("TimeoutError", runaway.stderr)
        self.assertIsNone(runaway.final_answer)
        self.assertTrue(any("TimeoutError" in m["content"] for m in model.prompts[2]))
        self.assertEqual(batched.stdout, f"['{SECRET}'] False\n")
        self.assertEqual(len(batched.rlm_calls), 6)
        self.assertEqual(verify.stdout, "confirmed\n")
        self.assertEqual([c.response for c in verify.rlm_calls], ["confirmed"])
        # The child run: a sandbox of its own, its llm_query at depth 2 on the same handler.
        self.assertEqual(len(child_runs), 1)
        self.assertEqual(child_runs[0][1], "confirmed")
        self.assertIn(2, {r["depth"] for r in handler.requests})
        self.assertIn(1, {r["depth"] for r in handler.requests})
        self.assertEqual(env.get_history_count(), 1)

        # Turn 2: a new handler (the library starts one per completion), a new context.
        with FakeLMHandler(sub_lm) as handler2:
            env.update_handler_address(handler2.address)
            self.assertEqual(env.add_context({"question": "code?"}), 1)
            model2 = ScriptedLM(list(FOLLOW_UP_TURNS))
            final2, _, results2 = run_completion(env, model2, "Say it again")

        self.assertEqual(final2, f"code? {SECRET}")
        self.assertIsNone(results2[0].final_answer)  # turn 1's answer did not leak
        self.assertEqual(results2[0].stdout,
                         f"code? {len(messages)} What is the secret c\n"
                         f"['{SECRET}'] 6 {len(document)}\n")
        self.assertEqual(env.get_context_count(), 2)
        self.assertEqual(env.get_history_count(), 2)


if __name__ == "__main__":
    unittest.main()
