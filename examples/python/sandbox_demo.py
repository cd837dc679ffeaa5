"""The installed Python package: one sandboxed Python cell, its state kept for the next.

    pip install /path/to/rlm-sandbox/python      # offline: needs nothing from PyPI
    python3 sandbox_demo.py

The package finds the rlm-sandbox CLI on PATH, in the prefix Python runs from, or through
RLM_SANDBOX_BIN.
"""

import sys

from rlm_sandbox import RlmSandbox


def main() -> int:
    with RlmSandbox(on_llm_query=lambda prompt, model: prompt.upper(), timeout=30) as sandbox:
        sandbox.execute("x = 6 * 7")
        cell = sandbox.execute("print(x, llm_query('hello'))")
    print("cell:", cell.status, cell.stdout, end="")
    return 0 if cell.status == "ok" and cell.stdout == "42 HELLO\n" else 1


if __name__ == "__main__":
    sys.exit(main())
