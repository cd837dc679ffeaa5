"""rlm-sandbox Python REPL worker (runs inside the sandbox).

Started as `python3 -I -S -c <this source>`; the protocol it speaks is docs/control-channel.md.
Stdlib only, Python 3.9+. One script, concatenated at build time from the parts listed in
worker/python/parts.txt (this one first); the parts share its one global namespace.

Processes: the root (this process) becomes a child subreaper, forks the first interpreter and
then only reaps. Interpreters hold the REPL state. Between cells (off the path the host waits
on) the interpreter holding the state forks a standby and stays behind frozen as the
checkpoint the host can roll back to; the next cell runs in the standby, in-process, which
then forks the next standby and becomes the checkpoint in turn.

Rollback integrity: a cell runs as the same user as its checkpoint, snapshots and the root, so
every process here is non-dumpable before any cell runs (the kernel then refuses their
/proc/PID/mem, environ, fd... to a same-user process without CAP_SYS_PTRACE), and the sandbox's
init lets a process signal only itself and processes started after it (docs/sessions.md).
"""

# The base: what every part uses (exit codes, diagnostics, the values set once at start-up).

import os

# Seconds a standby waits after a paused caller's result before it forks (twice that, a
# discarded interpreter before it exits): both are heavy on the CPU, and the caller is taking
# the result.
HANDOVER_PAUSE = 0.0005
EXIT_STARTUP = 1   # the worker could not start (bad environment, unreadable context)
EXIT_PROTOCOL = 2  # the host broke the protocol (oversize or malformed frame, unexpected op)

# Set once at start-up and inherited by every fork.
DIAG_FD = 2        # a private dup of the original stderr: fd 2 is a pipe while a cell runs
ROOT_PID = 0       # the subreaper; processes outside its tree are never killed


def diag(message: str) -> None:
    try:
        os.write(DIAG_FD, ('rlm_worker: %s\n' % message).encode('utf-8', 'replace'))
    except OSError:
        pass


def die(message: str, code: int):
    diag(message)
    os._exit(code)


def protocol_violation(message: str):
    die('protocol error: ' + message, EXIT_PROTOCOL)
