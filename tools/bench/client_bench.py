#!/usr/bin/env python3
"""What an orchestrator's steps cost through the Python client (`rlm_sandbox.RlmSandbox` over
`rlm-sandbox repl`), beside the same step done the way the RLM library's LocalREPL does it
(in-process exec, a context through a temporary file), measured round by round in one run:

  back_to_back_cell   execute("pass") sent the moment the previous result is in
  paused_cell         the same after a 20 ms pause (the standby ready)
  batched_50          llm_query_batched of 50 prompts, the client answering at once (timed in
                      the cell)
  prompt_10mb         llm_query of a 10 MB prompt (the repl's lines are capped at 16 MiB), the client answering its length (timed in
                      the cell: the prompt's trip to the orchestrator's callback)
  add_context_50mb    add_context of a 50 MB string to the live session (timed on the client)

    tools/bench/client_bench.py [--rounds N] [--binary PATH]
Prints a table of medians and p99s, the ratio of each step to its in-process baseline, and the
issue's targets.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from rlm_sandbox import RlmSandbox  # noqa: E402

BULK = 50_000_000
# The repl's lines, and so its prompts, are at most 16 MiB (the session's frame cap).
PROMPT = 10_000_000


def percentile(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def printed_ms(sandbox, code):
    cell = sandbox.execute(code)
    if cell.status != "ok":
        raise RuntimeError(f"the bench cell ended {cell.status}: {cell.error or cell.stderr}")
    return float(cell.stdout)


def local_baselines(samples):
    """The steps as LocalREPL does them: exec in this process, a context through a file."""
    namespace = {}
    start = time.perf_counter()
    exec("pass", namespace)
    samples["local_cell"].append((time.perf_counter() - start) * 1000)
    text = "a" * BULK
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile("w", delete=False) as handle:
        handle.write(text)
    with open(handle.name) as source:
        namespace["context_1"] = source.read()
    os.unlink(handle.name)
    samples["local_add_context_50mb"].append((time.perf_counter() - start) * 1000)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--binary", default=None)
    args = parser.parse_args()
    samples = {name: [] for name in (
        "local_cell", "paused_cell", "back_to_back_cell", "batched_50", "prompt_10mb",
        "local_add_context_50mb", "add_context_50mb")}
    can_add = hasattr(RlmSandbox, "add_context")
    with RlmSandbox(binary=args.binary, on_llm_query=lambda prompt, model: str(len(prompt)),
                    ) as sandbox:
        sandbox.execute("_p = 'a' * %d" % PROMPT)
        for _ in range(args.rounds):
            local_baselines(samples)
            time.sleep(0.02)
            start = time.perf_counter()
            sandbox.execute("pass")
            samples["paused_cell"].append((time.perf_counter() - start) * 1000)
            for _ in range(10):
                start = time.perf_counter()
                sandbox.execute("pass")
                samples["back_to_back_cell"].append((time.perf_counter() - start) * 1000)
            samples["batched_50"].append(printed_ms(
                sandbox, "import time\n_s = time.perf_counter(); llm_query_batched(['x'] * 50)\n"
                         "print((time.perf_counter() - _s) * 1000)"))
            samples["prompt_10mb"].append(printed_ms(
                sandbox, "import time\n_s = time.perf_counter(); _n = llm_query(_p)\n"
                         "print((time.perf_counter() - _s) * 1000)"))
            if can_add:
                start = time.perf_counter()
                sandbox.add_context("a" * BULK, index=1)  # replaced: one 50 MB context held
                samples["add_context_50mb"].append((time.perf_counter() - start) * 1000)
    baseline = {"paused_cell": "local_cell", "back_to_back_cell": "local_cell",
                "batched_50": None, "prompt_10mb": None,
                "add_context_50mb": "local_add_context_50mb"}
    print("\n%-24s %10s %10s %8s   %s" % ("client step", "median ms", "p99 ms", "samples",
                                         "ratio to its LocalREPL-style baseline"))
    for name, values in samples.items():
        if not values:
            print("%-24s skipped (this client has no add_context)" % name)
            continue
        median = statistics.median(values)
        base = baseline.get(name)
        ratio = ("%.2fx %s" % (median / statistics.median(samples[base]), base)
                 if base and samples[base] else "")
        print("%-24s %10.3f %10.3f %8d   %s" % (name, median, percentile(values, 0.99),
                                               len(values), ratio))
    for name, size in (("prompt_10mb", PROMPT), ("add_context_50mb", BULK)):
        if samples[name]:
            print("%s: %.0f MB/s" % (name, size / 1e6 / (statistics.median(samples[name]) / 1000)))
    print("targets: back_to_back_cell <= 1 ms, batched_50 <= 10 ms, prompt >= 500 MB/s, "
          "add_context_50mb <= 300 ms")


if __name__ == "__main__":
    main()
