"""Drop-in adapters that let existing RLM orchestrators run their code in rlm-sandbox.

- :mod:`rlm_sandbox.integrations.rlm`: ``RlmSandboxREPL``, an environment for the RLM library
  (``from rlm import RLM``), with the library's persistence protocol and custom tools.
- :mod:`rlm_sandbox.integrations.dspy`: ``RlmSandboxInterpreter``, a code interpreter for
  ``dspy.RLM`` (its ``CodeInterpreter`` protocol: tools, ``SUBMIT``, ``execute``).

Both are standard library only: they import the library they adapt when it is installed (to
return its own result types) and use small stand-ins with the same fields when it is not.
"""
