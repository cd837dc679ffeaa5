#!/usr/bin/env python3
"""The RLM library's own completion loop with its LocalREPL against the same loop in rlm-sandbox.

The reference library (alexzhang13/rlm) runs `RLM.completion` over a 5 MB context for 20
iterations: its model is scripted here (a `get_client` stand-in returning a fixed turn per
iteration), each turn one ```repl block that slices the context, counts lines, prints, and asks
`llm_query` (answered by the library's own LM handler); the last sets `answer["ready"]`. The
same script runs with `environment="local"` (LocalREPL, in process, no isolation) and with the
environment `rlm_sandbox.integrations.rlm.sandboxed()` gives (through the CLI's `repl`, and
through a server's warm sessions with `--server`), interleaved round by round, and prints each
round's times and the median ratio.

    PYTHONPATH=/path/to/rlm tools/bench/rlm_loop_bench.py [--rounds N] [--binary PATH]
        [--server SOCKET]

The library is not a dependency of this project and is not installed by its setup: without an
importable `rlm` the bench says so and exits 0. The library imports a few packages only its
clients use (`dotenv`, `rich`, `openai`, ...); stand-ins for them are enough, as no client runs.
"""

import argparse
import os
import statistics
import sys
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from rlm_sandbox.integrations.rlm import sandboxed  # noqa: E402

ITERATIONS = 20
CONTEXT_LINES = 90_000  # 4.9 MB


def script() -> list:
    """The model's turns: 19 working ones, then the answer."""
    turns = []
    for i in range(ITERATIONS - 1):
        turns.append(f"```repl\nchunk = context[{i * 1000}:{(i + 1) * 1000}]\n"
                     f"n{i} = len(chunk.splitlines())\nprint(n{i})\n"
                     f"note = llm_query('summarize ' + chunk[:50])\n```")
    turns.append("```repl\nanswer['content'] = str(n0)\nanswer['ready'] = True\n```")
    return turns


class ScriptedClient:
    """What `rlm.clients.get_client` returns: the root model's turns in order; llm_query's
    prompts (plain strings) get a fixed answer."""

    model_name = "scripted"

    def __init__(self) -> None:
        self.turns = script()

    def completion(self, prompt, model=None):
        if isinstance(prompt, str):
            return "a summary"
        return self.turns.pop(0)

    async def acompletion(self, prompt, model=None):
        return self.completion(prompt, model)

    def get_usage_summary(self):
        from rlm.core.types import ModelUsageSummary, UsageSummary  # noqa: PLC0415
        return UsageSummary(model_usage_summaries={
            self.model_name: ModelUsageSummary(total_calls=1, total_input_tokens=1,
                                               total_output_tokens=1)})

    def get_last_usage(self):
        from rlm.core.types import ModelUsageSummary  # noqa: PLC0415
        return ModelUsageSummary(total_calls=1, total_input_tokens=1, total_output_tokens=1)


def one_run(core, rlm_class, context: str, environment_kwargs: dict) -> float:
    with mock.patch.object(core, "get_client", side_effect=lambda *a, **k: ScriptedClient()):
        loop = rlm_class(backend="openai", backend_kwargs={"model_name": "scripted"},
                         environment="local", environment_kwargs=environment_kwargs,
                         max_iterations=ITERATIONS + 5)
        start = time.perf_counter()
        result = loop.completion(context)
        took = time.perf_counter() - start
    expected = str(len(context[:1000].splitlines()))
    if result.response != expected:
        raise SystemExit(f"the loop answered {result.response!r}, not {expected!r}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--binary", default=os.environ.get("RLM_SANDBOX_BIN"))
    parser.add_argument("--server", help="a `rlm-sandbox serve` socket with warm sessions")
    args = parser.parse_args()
    try:
        import rlm.core.rlm as core  # noqa: PLC0415
        from rlm import RLM  # noqa: PLC0415
    except ImportError as error:
        print(f"rlm_loop_bench: the RLM library is not importable ({error}); skipped")
        return 0
    context = "\n".join(f"line {i:07d}: nothing to see here, move along please."
                        for i in range(CONTEXT_LINES))
    columns = {"LocalREPL": {}}
    columns["rlm_sandbox (CLI repl)"] = sandboxed(**({"binary": args.binary} if args.binary
                                                     else {}))
    if args.server:
        columns["rlm_sandbox (server)"] = sandboxed(server=args.server)
    times = {name: [] for name in columns}
    print(f"{ITERATIONS} iterations over a {len(context) / 1e6:.1f} MB context, "
          f"{args.rounds} interleaved rounds")
    for round_number in range(args.rounds):
        line = []
        for name, kwargs in columns.items():
            took = one_run(core, RLM, context, kwargs)
            times[name].append(took)
            line.append(f"{name} {took * 1000:.0f} ms")
        print(f"round {round_number}: " + ", ".join(line))
    base = statistics.median(times["LocalREPL"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:24s} median {median * 1000:7.1f} ms  {median / base:.2f}x LocalREPL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
