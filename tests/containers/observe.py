"""Runs inside one lane container (tests/containers/run-lane starts it): asks the CLI what it
thinks of this container (`health --json`, with each shipped policy) and what it does (runs under
each policy), probes a few syscalls Docker's default profile denies, and prints one JSON object.
Judges nothing: the lane on the host compares and asserts.

  python3 observe.py BUILD_DIR MARKER
"""

import ctypes
import json
import os
import subprocess
import sys

build, marker = sys.argv[1], sys.argv[2]
cli = os.path.join(build, "bin", "rlm-sandbox")
POLICIES = ["default", "strict", "python-repl", "ci", "trusted-local"]
TIMEOUT = 60


def command(*argv):
    try:
        done = subprocess.run([cli, *argv], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "stdout": "", "stderr": ""}
    return {"rc": done.returncode, "stdout": done.stdout.decode(errors="replace")[-20000:],
            "stderr": done.stderr.decode(errors="replace")[-4000:]}


def health(*extra):
    done = command("health", "--json", *extra)
    try:
        done["json"] = json.loads(done["stdout"])
    except ValueError:
        done["json"] = None
    del done["stdout"]
    return done


def run(policy, *argv):
    done = command("run", "--policy", policy, "--", *argv)
    del done["stdout"]
    return done


# Syscall numbers on x86_64 and arguments that fail harmlessly once past seccomp: invalid
# commands, null pointers, bad descriptors. Under a filter that denies them the answer is EPERM.
PROBES = {
    "keyctl": (250, [0xFFFF, 0, 0, 0, 0]),
    "userfaultfd": (323, [0x7FFFFFFF, 0, 0, 0, 0]),
    "bpf": (321, [0xFFFF, 0, 0, 0, 0]),
    "open_by_handle_at": (304, [-1, 0, 0, 0, 0]),
    "kexec_load": (246, [0, 0, 0, 0, 0]),
    "perf_event_open": (298, [0, 0, -1, -1, 0]),
}


def syscall_errnos():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    answers = {}
    for name, (number, args) in PROBES.items():
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        answers[name] = 0 if result >= 0 else ctypes.get_errno()
    return answers


observed = {
    "uid": os.getuid(),
    "health": health(),
    "policies": {},
    "syscalls": syscall_errnos() if os.uname().machine == "x86_64" else {},
}
for policy in POLICIES:
    observed["policies"][policy] = {
        "health": health("--policy", policy),
        "true": run(policy, "/usr/bin/true"),
        # Exits 0 only when the payload sees the container's own root filesystem.
        "marker": run(policy, "/usr/bin/cat", marker),
    }
print(json.dumps(observed))
