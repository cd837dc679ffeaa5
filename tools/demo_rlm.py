#!/usr/bin/env python3
"""The RLM half of the demo: a sandboxed Recursive-Language-Model session, end to end.

A long document is loaded as `context` into a persistent Python REPL inside the sandbox
(`rlm-sandbox repl`, driven through the rlm_sandbox client in python/). A scripted "root model"
plays the orchestrator: it writes cells that inspect the context, ask a "sub-model" with
llm_query / llm_query_batched (answered here, on the host, by a deterministic stand-in for a
real LM), survive a runaway cell by rollback, and finish as the RLM library's runs do: by setting
answer["content"] and then answer["ready"] = True.

    tools/demo_rlm.py RLM_SANDBOX_BINARY
"""

import os
import re
import sys
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from rlm_sandbox import RlmSandbox  # noqa: E402


def make_document() -> str:
    lines = []
    for i in range(20000):
        lines.append(f"[{i:05d}] service=api latency_ms={(i * 37) % 250} status=200")
    lines[13577] = "[13577] service=vault note=the launch code is 7491, rotate it on Monday"
    return "\n".join(lines)


def sub_model(prompt: str, model) -> str:
    """A stand-in for a small LM: answers the two kinds of question the cells ask."""
    question, _, text = prompt.partition("\n")
    if "slowest" in question:
        values = [int(v) for v in re.findall(r"latency_ms=(\d+)", text)]
        return str(max(values)) if values else "0"
    if "code" in question:
        digits = re.findall(r"\b\d{4}\b", text)
        return digits[-1] if digits else "no code found"
    return "I do not know"


CELLS = [
    ("Look at the context", "lines = context.splitlines()\nprint(len(context), 'chars,', len(lines), 'lines')\nlines[:2]", None),
    ("Find the interesting line", "hits = [l for l in lines if 'service=api' not in l]\nhits", None),
    ("A runaway cell is stopped and rolled back (1 s limit)", "hits = None\nwhile True:\n    pass", 1),
    ("State from before the runaway cell is intact", "print(hits)", None),
    ("Ask the sub-model (llm_query, answered on the host)",
     "code = llm_query('Extract the launch code from this line:\\n' + hits[0])\nprint('sub-model says:', code)", None),
    ("Fan out over chunks (llm_query_batched, concurrent)",
     "chunks = ['\\n'.join(lines[i:i + 5000]) for i in range(0, len(lines), 5000)]\n"
     "answers = llm_query_batched(['What is the slowest latency_ms here?\\n' + c for c in chunks])\n"
     "print(answers)", None),
    ("Finish: answer['ready'] = True",
     "answer['content'] = f'launch code {code}, slowest {max(int(a) for a in answers)} ms'\n"
     "answer['ready'] = True", None),
]


def main() -> int:
    binary = sys.argv[1]
    document = make_document()
    print(f"context: {len(document):,} characters of logs with one line that matters")
    start = time.monotonic()
    with RlmSandbox(binary=binary, context=document, on_llm_query=sub_model, timeout=10) as sandbox:
        print(f"session up on the {sandbox.backend} backend, policy {sandbox.policy}")
        final = None  # the answer's content once a cell set answer["ready"]
        for title, code, timeout in CELLS:
            print(f"\n-- {title}")
            print(textwrap.indent(code, "   >>> "))
            cell = sandbox.execute(code, timeout=timeout)
            shown = cell.stdout if len(cell.stdout) < 400 else cell.stdout[:400] + "...\n"
            print(textwrap.indent(shown.rstrip("\n"), "   ") if shown.strip() else "", end="")
            print(f"\n   [{cell.status}{', rolled back' if cell.rolled_back else ''}; "
                  f"{cell.wall_ms:.1f} ms; {cell.llm_calls} llm calls]")
            if cell.answer is not None:
                final = cell.answer
        result = sandbox.close()
    print(f"\nanswer: {final}")
    print(f"session closed: {result['status']}, whole session {time.monotonic() - start:.2f} s, "
          f"peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB")
    expected = "launch code 7491, slowest 249 ms"
    if final != expected:
        print(f"demo: expected the answer {expected!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
