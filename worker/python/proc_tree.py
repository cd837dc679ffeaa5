# The process tree as /proc shows it: what a rollback kills, and the children a frozen
# interpreter watches.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import os
import signal
import threading


def read_proc_table() -> dict:
    """pid -> (ppid, start time in clock ticks, state) for every process we can see."""
    table = {}
    try:
        names = os.listdir('/proc')
    except OSError:
        return table
    for name in names:
        entry = read_proc_stat(int(name)) if name.isdigit() else None
        if entry is not None:
            table[int(name)] = entry
    return table


def read_proc_stat(pid: int):
    """(ppid, start time, state) from /proc/PID/stat, or None."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as f:
            line = f.read()
        # comm (field 2) may hold spaces and ')': the other fields start after the last ')'.
        fields = line[line.rfind(b')') + 2:].split()
        return int(fields[1]), int(fields[19]), fields[0].decode()
    except (OSError, IndexError, ValueError):
        return None


def proc_start_time(pid: int):
    entry = read_proc_stat(pid)
    return entry[1] if entry else None


def chain_of(pid: int, table: dict) -> list:
    """pid and its ancestors, as far as the table goes."""
    chain = []
    while pid in table and pid not in chain and len(chain) < 4096:
        chain.append(pid)
        pid = table[pid][0]
    chain.append(pid)
    return chain


def kill_started_after(child: 'ChildWatch') -> None:
    """SIGKILLs every process in the root's tree started after the child (the child too),
    except this process and its ancestors. Repeats until a pass finds nobody, so a process
    forking while we scan is caught on the next pass."""
    me, since = os.getpid(), child.start_time
    signalled = set()

    def started_after_child(pid: int, start: int, table: dict) -> bool:
        if start != since:
            return start > since
        # The same clock tick (10 ms): pids grow, and the child's own tree counts anyway.
        return pid >= child.pid or child.pid in chain_of(pid, table)

    for _ in range(200):
        table = read_proc_table()
        protected = set(chain_of(me, table)) | {1}
        victims = [pid for pid, (_, start, state) in table.items()
                   if state not in ('Z', 'X') and pid not in protected
                   and started_after_child(pid, start, table)
                   and ROOT_PID in chain_of(pid, table)[1:]]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if signalled.issuperset(victims):
            threading.Event().wait(0.002)  # all already dying: give them a moment
        signalled.update(victims)


def decode_wait_status(status: int):
    """(exit_code, signal) as rolled_back reports them."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return None, None


class ChildWatch:
    """A forked interpreter as its frozen parent sees it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.start_time = proc_start_time(pid)
        self.pidfd = -1
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass  # Python < 3.9 or kernel < 5.3: wait_frozen polls instead

    def has_exited(self) -> bool:
        try:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT  # look, do not reap yet
            return os.waitid(os.P_PID, self.pid, flags) is not None
        except ChildProcessError:
            return True

    def reap(self):
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return None, None
        return decode_wait_status(status)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
