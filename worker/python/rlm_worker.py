"""rlm-sandbox Python REPL worker (runs inside the sandbox).

Started as `python3 -I -S -c <this source>`; the protocol it speaks is docs/control-channel.md.
Stdlib only, one file, Python 3.9+.

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

import ast
import builtins
import collections
import gc
import errno
import json
import linecache
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
import types
import warnings

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
DEFAULT_OUTPUT_CAP = 1024 * 1024
# Seconds between a cell's result and the next standby's fork (and the old checkpoint's exit):
# both are heavy on the CPU, and the host is taking the result.
HANDOVER_PAUSE = 0.003
EXIT_STARTUP = 1   # the worker could not start (bad environment, unreadable context)
EXIT_PROTOCOL = 2  # the host broke the protocol (oversize or malformed frame, unexpected op)
CELL_FILE = '<cell>'
WORKER_FILE = (lambda: None).__code__.co_filename  # '<string>' under `python3 -c`
CHILD_POLL_SECONDS = 0.01  # only when os.pidfd_open is unavailable
HEADER = struct.Struct('>I')
# The host refuses a frame nested deeper than 64 levels; a cell_result holds `final` two levels
# down (docs/control-channel.md).
MAX_FINAL_DEPTH = 62
# The host refuses a frame holding more than 100,000 JSON values (each costs it up to ~100 bytes
# however small); a cell_result's own fields take a few of them.
MAX_FINAL_VALUES = 99900
MAX_BATCH = 10000  # prompts per llm_query_batched: the host ends the session beyond it

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


class StartupError(Exception):
    pass


class FrameTooLarge(Exception):
    pass


# --------------------------------------------------------------------------------------------
# The channel


def encode_frame(message: dict) -> bytes:
    # ensure_ascii=False keeps frames small; lone surrogates a cell may produce become '?' so
    # the frame stays valid UTF-8. NaN/Infinity are not JSON, so they are refused.
    text = json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(',', ':'))
    return text.encode('utf-8', 'replace')


def decode_frame(body: bytes) -> dict:
    try:
        message = json.loads(body.decode('utf-8'))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        protocol_violation('a frame from the host is not UTF-8 JSON (%s)' % exc)
    if not isinstance(message, dict):
        protocol_violation('a frame from the host is not a JSON object')
    return message


class Channel:
    """One interpreter's end of the control channel.

    Any thread may send. Reading is done by one thread at a time (the "reader"): whoever needs
    a frame and finds nobody reading takes the role, files llm answers by id and queues every
    other frame as an op, and hands the role on when it has what it waited for. So the main
    loop and any number of cell threads blocked in llm_query share one socket.
    """

    def __init__(self, sock: socket.socket, max_frame: int):
        self.sock = sock
        self.max_frame = max_frame
        self.owner = os.getpid()
        self._send_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._reading = False
        self._buffer = bytearray()
        self._ops = collections.deque()
        self._replies = {}
        self._pending = set()
        self._next_query_id = 1
        self._cell_running = False
        self._frozen = False  # the main thread reads for good (wait_frozen)
        # Wakes a reader blocked in poll() when the cell ends, so it re-checks its wait.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def close(self) -> None:
        """Drops this process's copy of the channel (never shuts the connection down)."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.sock.close()

    # -- sending

    def send(self, message: dict, fd: int = -1) -> None:
        """Sends one frame; with fd, attaches it to the frame's first byte (SCM_RIGHTS)."""
        data = encode_frame(message)
        if len(data) > self.max_frame:
            raise FrameTooLarge(len(data))
        header = HEADER.pack(len(data))
        try:
            with self._send_lock:
                if fd < 0:
                    self.sock.sendall(header + data)
                else:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', fd))]
                    sent = self.sock.sendmsg([header], rights)
                    self.sock.sendall(header[sent:] + data)
        except OSError:
            os._exit(0)  # the host closed the channel: same as reading EOF

    # -- receiving

    def _fill(self) -> None:
        """One recv into the buffer, then files every complete frame."""
        want = 1 << 16
        if len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            want = max(want, min(length + HEADER.size - len(self._buffer), 1 << 22))
        try:
            chunk = self.sock.recv(want)
        except OSError:
            chunk = b''
        if not chunk:
            os._exit(0)  # EOF: the host is done with this interpreter
        self._buffer += chunk
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if length > self.max_frame:
                protocol_violation('a frame of %d bytes exceeds the maximum of %d bytes'
                                   % (length, self.max_frame))
            if len(self._buffer) < HEADER.size + length:
                return
            body = bytes(self._buffer[HEADER.size:HEADER.size + length])
            del self._buffer[:HEADER.size + length]
            self._file(decode_frame(body))

    def _file(self, frame: dict) -> None:
        op = frame.get('op')
        if op == 'discard':
            # In any state, without another action; the exit (unmapping a whole interpreter)
            # waits for the host to have taken the result that made this process obsolete.
            time.sleep(2 * HANDOVER_PAUSE)
            os._exit(0)
        with self._cond:
            if op in ('llm_result', 'llm_results'):
                query_id = frame.get('id')
                # Answers nobody waits for any more (the cell ended) are dropped.
                if isinstance(query_id, int) and query_id in self._pending:
                    self._replies[query_id] = frame
            else:
                self._ops.append(frame)
            self._cond.notify_all()

    def _wait_readable(self) -> None:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        if self.sock.fileno() in ready:
            self._fill()

    def _wait(self, take):
        """Returns the first non-None take() (called under the lock), reading as needed."""
        with self._cond:
            while True:
                item = take()
                if item is not None:
                    return item
                if not self._reading:
                    self._reading = True
                    break
                self._cond.wait()
        try:
            while True:
                self._wait_readable()
                with self._cond:
                    item = take()
                    if item is not None:
                        return item
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def next_op(self) -> dict:
        return self._wait(lambda: self._ops.popleft() if self._ops else None)

    def _claim_for_good(self) -> None:
        """Makes the calling thread the channel's only reader from now on. A frozen process may
        still hold threads its last cell left behind; they cannot query (the cell is over), and
        one that was reading hands the role back promptly (end_cell woke it)."""
        if self._frozen:
            return
        with self._cond:
            while self._reading:
                self._cond.wait()
            self._reading = self._frozen = True

    def _socket_ready(self, timeout_ms) -> bool:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(timeout_ms))

    def wait_frozen(self, children: list):
        """For a frozen interpreter: the next op, or a ChildWatch whose process has exited.
        Frames win over a child's death when both are ready."""
        self._claim_for_good()
        while True:
            if self._ops:
                return self._ops.popleft()
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            for child in children:
                if child.pidfd >= 0:
                    poller.register(child.pidfd, select.POLLIN)
            polling = any(child.pidfd < 0 for child in children)
            ready = {fd for fd, _ in poller.poll(CHILD_POLL_SECONDS * 1000 if polling else None)}
            if self.sock.fileno() in ready:
                self._fill()
                continue
            exited = next((child for child in children if child.has_exited()), None)
            if exited is None:
                continue
            # A frame the host sent before the child died (commit, then discard to the child)
            # may have arrived after poll looked at the socket: it still goes first.
            if self._socket_ready(0):
                self._fill()
                continue
            return exited

    # -- cells and llm queries

    def begin_cell(self) -> None:
        with self._cond:
            self._cell_running = True

    def end_cell(self) -> None:
        """Fails every llm_query still waiting (a thread the cell left behind)."""
        with self._cond:
            self._cell_running = False
            self._cond.notify_all()
        try:
            os.write(self._wake_w, b'.')
        except OSError:
            pass

    def query(self, message: dict) -> dict:
        """Sends an llm request and waits for the answer with the same id."""
        if os.getpid() != self.owner:
            raise RuntimeError('llm_query is not available in a process forked by the cell')
        with self._cond:
            if not self._cell_running:
                raise RuntimeError('llm_query can only be called while a cell is running')
            query_id = self._next_query_id
            self._next_query_id += 1
            self._pending.add(query_id)
        message['id'] = query_id
        try:
            self.send(message)
        except FrameTooLarge as exc:
            with self._cond:
                self._pending.discard(query_id)
            raise ValueError('the request is %d bytes, over the channel maximum of %d'
                             % (exc.args[0], self.max_frame)) from None

        def take():
            if query_id in self._replies:
                self._pending.discard(query_id)
                return self._replies.pop(query_id)
            if not self._cell_running:
                self._pending.discard(query_id)
                raise RuntimeError('the cell ended before the answer to llm_query arrived')
            return None

        return self._wait(take)


# --------------------------------------------------------------------------------------------
# Processes


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


def is_op_id(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def was_rolled_back(op_id) -> bool:
    return is_op_id(op_id) and op_id in SESSION.rolled_back


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


def raise_oom_score() -> None:
    """Makes the interpreters the OOM killer's first choice (every fork inherits the value). For
    the first interpreter, before any cell exists: a non-dumpable process's /proc files belong to
    root, so it is dumpable for the write."""
    try:
        LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        with open('/proc/self/oom_score_adj', 'w') as f:
            f.write('1000')
    except (OSError, AttributeError):
        pass
    make_undumpable()


PR_SET_DUMPABLE = 4
LIBC = None  # ctypes' libc, loaded once before any cell runs


def make_undumpable() -> None:
    """Keeps every other process of the sandbox (a cell runs as the same user) out of this one's
    memory: /proc/PID/mem, environ, fd and the like need ptrace access, which the kernel refuses
    for a non-dumpable process to anyone without CAP_SYS_PTRACE. Inherited by fork; set again
    before each fork, since a cell may have made its own process dumpable again."""
    global LIBC
    try:
        if LIBC is None:
            import ctypes
            LIBC = ctypes.CDLL(None, use_errno=True)
        if LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return
        error = 'prctl: errno %d' % __import__('ctypes').get_errno()
    except (ImportError, OSError, AttributeError) as exc:
        error = str(exc)
    die('cannot make the interpreter non-dumpable (%s): a cell could write into its '
        'checkpoint' % error, EXIT_STARTUP)


def fork_standby(channel: Channel, fork_id):
    """Forks a standby (docs/control-channel.md, "Forking a standby"). In the child returns its
    new Channel (the child is the standby now); in the parent sends the fork frame on the
    parent's channel and returns a ChildWatch (the parent is now the armed checkpoint)."""
    flush_std_streams()  # else buffered output would be written twice
    make_undumpable()  # the cell that ran here may have undone it; both sides inherit it
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        mine.close()
        channel.close()  # else the child could speak for its checkpoint, and hide its EOF
        for watch in SESSION.watches:
            watch.close()  # the checkpoint's pidfds are its own
        SESSION.watches = []
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        # Cells (and what they exec) see SIGHUP as usual. This process's group is its own, and
        # anchored by it (its parent is in another group of the same session), so no cell can
        # orphan it once it is a checkpoint.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        child_channel = Channel(theirs, channel.max_frame)
        SESSION.channel = child_channel
        warm_up()
        return child_channel
    theirs.close()
    try:
        os.setpgid(pid, pid)  # also here, so the group exists before we could kill it
    except OSError:
        pass
    child = ChildWatch(pid)
    SESSION.watches.append(child)
    channel.send({'type': 'fork', 'id': fork_id, 'pid': pid}, fd=mine.fileno())
    mine.close()
    return child


def warm_up() -> None:
    """Readies a fresh standby while it waits, so the next cell does not pay for it: every
    page the fork shares with the checkpoint is copied on its first write, and a cell would
    otherwise take those faults for the REPL's own machinery (and the garbage collector's
    full-heap passes). The objects that exist now are frozen out of the collector until the
    cell ends (run_cell unfreezes them), and one empty cell runs through the same path with
    nothing sent."""
    gc.freeze()
    scratch = {'__builtins__': builtins}
    capture = OutputCapture().activate(0)
    try:
        run_source('pass', scratch)
    finally:
        capture.finish()
    SESSION.next_capture = OutputCapture()
    json.dumps({'type': 'cell_result', 'id': 0, 'status': 'ok', 'stdout': '', 'stderr': '',
                'error': None, 'cpu_ms': cpu_seconds()})


def roll_back(child: ChildWatch):
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(child.pid, signal.SIGKILL)
    except OSError:
        pass
    if child.start_time is not None:  # else no /proc: the process group is all we can do
        kill_started_after(child)
    return child.reap()


def forget(child: ChildWatch) -> None:
    child.close()
    SESSION.watches.remove(child)


def become_checkpoint(channel: Channel, fork_id) -> Channel:
    """Forks a standby and stays behind as the frozen checkpoint, armed. Returns only in a
    standby (the first one or one forked later by rollback or restore), with its channel;
    discard and EOF exit inside the channel without touching any child."""
    forked = fork_standby(channel, fork_id)
    while True:
        if isinstance(forked, Channel):
            return forked
        armed, forked = forked, None  # armed: the standby whose death means rollback
        while forked is None:
            event = channel.wait_frozen(SESSION.watches)
            if isinstance(event, ChildWatch):
                if event is armed:  # the standby died (OOM killer, segfault, os._exit)
                    forked = roll_back_and_refork(channel, armed, None)
                else:  # a former standby disarmed by commit: only reap it
                    event.reap()
                    forget(event)
                continue
            kind, op_id = event.get('op'), event.get('id')
            if kind == 'rollback':
                if armed is None or was_rolled_back(op_id):
                    continue  # crossed S's death (or a commit) we already acted on
                if not is_op_id(op_id):
                    protocol_violation('rollback needs an id')
                forked = roll_back_and_refork(channel, armed, op_id)
            elif kind == 'commit':
                armed = None  # a snapshot for good: the child lives on, only reaped
            elif kind == 'restore':
                if armed is not None:
                    protocol_violation('restore sent to an armed checkpoint (commit it first)')
                if not is_op_id(op_id):
                    protocol_violation('restore needs an id')
                forked = fork_standby(channel, op_id)
            else:
                protocol_violation('unexpected op %r for a frozen interpreter' % kind)


def roll_back_and_refork(channel: Channel, standby: ChildWatch, op_id):
    """Kills the standby and everything started after it, reports, forks a new standby."""
    try:
        exit_code, sig = roll_back(standby)
    finally:
        forget(standby)
    if op_id is not None:
        SESSION.rolled_back.add(op_id)
    channel.send({'type': 'rolled_back', 'id': op_id, 'exit_code': exit_code, 'signal': sig})
    return fork_standby(channel, op_id)


# --------------------------------------------------------------------------------------------
# Cells


class CapturedStream:
    """One of fds 1 and 2 pointed at a pipe, keeping at most `cap` bytes of what is written."""

    def __init__(self, fd: int):
        self.fd = fd
        self.cap = 0
        self.data = bytearray()
        self.truncated = False
        self.open = True
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.saved = -1

    def activate(self, cap: int) -> None:
        self.cap = cap
        self.saved = os.dup(self.fd)
        os.dup2(self.write_fd, self.fd)  # inheritable: subprocesses write here too
        os.close(self.write_fd)

    def read_some(self, max_reads: int) -> None:
        """Reads what the pipe holds (at most max_reads chunks); at EOF marks it closed."""
        for _ in range(max_reads):
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.open = False  # every writer is gone
                return
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True  # read and dropped, so the writer never blocks

    def restore(self) -> None:
        os.dup2(self.saved, self.fd)
        os.close(self.saved)

    def text(self):
        os.close(self.read_fd)
        return bytes(self.data).decode('utf-8', 'replace'), self.truncated


class OutputCapture:
    """Points fds 1 and 2 at pipes drained by one thread for the duration of a cell. Made (pipes
    and thread) by a standby while it waits; activate() is all a cell pays for."""

    def __init__(self):
        self.streams = (CapturedStream(1), CapturedStream(2))
        self.stop_r, self.stop_w = os.pipe()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def activate(self, cap: int) -> 'OutputCapture':
        for stream in self.streams:
            stream.activate(cap)
        return self

    def _drain(self) -> None:
        poller = select.poll()
        by_fd = {}
        for stream in self.streams:
            poller.register(stream.read_fd, select.POLLIN)
            by_fd[stream.read_fd] = stream
        poller.register(self.stop_r, select.POLLIN)
        while by_fd:
            ready = {fd for fd, _ in poller.poll()}
            for fd in ready & by_fd.keys():
                stream = by_fd[fd]
                stream.read_some(16)
                if not stream.open:
                    poller.unregister(fd)
                    del by_fd[fd]
            if self.stop_r in ready:
                # The cell is over: take what is already in the pipes, but do not wait for
                # EOF, which a background process holding a pipe could delay for ever.
                for stream in by_fd.values():
                    stream.read_some(64)
                return

    def finish(self):
        """Puts fds 1 and 2 back; ((stdout, truncated), (stderr, truncated))."""
        for stream in self.streams:
            stream.restore()
        os.write(self.stop_w, b'.')
        self.thread.join()
        os.close(self.stop_r)
        os.close(self.stop_w)
        return tuple(stream.text() for stream in self.streams)


def flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class VarTable(dict):
    """SHOW_VARS()'s result: it prints itself, so the notebook display skips it."""


def run_source(code: str, namespace: dict) -> None:
    """Runs a cell like interactive input: a trailing expression's repr() is printed."""
    tree = ast.parse(code, CELL_FILE, 'exec')
    linecache.cache[CELL_FILE] = (len(code), None, code.splitlines(True), CELL_FILE)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
    # dont_inherit: the worker's own compiler flags must not leak into cells.
    exec(compile(tree, CELL_FILE, 'exec', dont_inherit=True), namespace)
    if last is not None:
        expression = ast.Expression(last.value)
        value = eval(compile(expression, CELL_FILE, 'eval', dont_inherit=True), namespace)
        if value is not None and not isinstance(value, VarTable):
            print(repr(value))


def trim_traceback(te, seen=None) -> None:
    """Drops the worker's frames: those before the first cell frame (the REPL machinery) and
    those after the last non-worker frame (inside llm_query, FINAL_VAR...)."""
    seen = set() if seen is None else seen
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    start = next((i for i, f in enumerate(frames) if f.filename == CELL_FILE), None)
    if start is None:
        start = 0
        while start < len(frames) and frames[start].filename == WORKER_FILE:
            start += 1
    end = len(frames)
    while end > start and frames[end - 1].filename == WORKER_FILE:
        end -= 1
    te.stack = traceback.StackSummary.from_list(frames[start:end])
    trim_traceback(te.__cause__, seen)
    trim_traceback(te.__context__, seen)
    for inner in getattr(te, 'exceptions', None) or ():
        trim_traceback(inner, seen)


def format_cell_error(exc: BaseException) -> str:
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    trim_traceback(te)
    return ''.join(te.format())


def fit_cell_result(channel: Channel, result: dict) -> None:
    """Sends the result, shrinking it until it fits in one frame: output first (flagged
    truncated), then the FINAL value, then the traceback."""
    while True:
        try:
            channel.send(result)
            return
        except FrameTooLarge:
            pass
        longest = max(('stdout', 'stderr'), key=lambda k: len(result[k]))
        if len(result[longest]) > 0:
            result[longest] = result[longest][:len(result[longest]) // 2]
            result[longest + '_truncated'] = True
        elif 'final' in result:
            del result['final']
            result['status'] = 'error'
            result['error'] = (result['error'] or '') + \
                'the FINAL value is too large for the control channel\n'
        elif result['error'] and len(result['error']) > 64:
            result['error'] = result['error'][:len(result['error']) // 2]
        else:
            die('a cell result does not fit in a %d-byte frame' % channel.max_frame,
                EXIT_PROTOCOL)


def cpu_seconds() -> float:
    """User + system time of this process and its reaped children, to the microsecond
    (os.times() counts in clock ticks of 10 ms)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_cell(channel: Channel, op_id, code: str, output_cap: int) -> dict:
    me = os.getpid()
    SESSION.final = None
    streams = sys.stdout, sys.stderr
    flush_std_streams()
    capture, SESSION.next_capture = SESSION.next_capture or OutputCapture(), None
    capture.activate(output_cap)
    before = cpu_seconds()
    channel.begin_cell()
    error = None
    try:
        run_source(code, SESSION.namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the cell's own
        error = format_cell_error(exc)
    if os.getpid() != me:
        os._exit(0)  # a process the cell forked ran off the end of the cell
    channel.end_cell()
    flush_std_streams()  # the cell's streams, if it replaced them
    sys.stdout, sys.stderr = streams
    flush_std_streams()
    (stdout, stdout_truncated), (stderr, stderr_truncated) = capture.finish()
    after = cpu_seconds()
    gc.unfreeze()  # warm_up froze the state before the cell; it is collectable again
    result = {
        'type': 'cell_result', 'id': op_id, 'status': 'error' if error else 'ok',
        'stdout': stdout, 'stderr': stderr,
        'stdout_truncated': stdout_truncated, 'stderr_truncated': stderr_truncated,
        'error': error,
        'cpu_ms': round((after - before) * 1000, 3),
    }
    if SESSION.final is not None:
        result['final'] = SESSION.final
    return result


# --------------------------------------------------------------------------------------------
# The REPL globals


class Session:
    """Per-interpreter state (each fork carries its own copy)."""

    def __init__(self):
        self.channel = None
        self.namespace = {}
        self.api = {}
        self.final = None
        self.next_capture = None  # made by the standby's warm_up for its cell
        self.rolled_back = set()  # rollback ids this interpreter (or its ancestor) took
        self.watches = []         # a frozen interpreter's children (pidfds), armed or not
        self.worker_module = sys.modules.get('__main__')  # stays alive once cells own __main__


SESSION = Session()


def check_model(model) -> None:
    if model is not None and not isinstance(model, str):
        raise TypeError('model must be a str or None, not %s' % type(model).__name__)


def llm_query(prompt, model=None):
    """Asks the host's language model; returns its text or raises RuntimeError."""
    if not isinstance(prompt, str):
        raise TypeError('prompt must be a str, not %s' % type(prompt).__name__)
    check_model(model)
    answer = SESSION.channel.query({'type': 'llm_query', 'prompt': prompt, 'model': model})
    if isinstance(answer.get('error'), str):
        raise RuntimeError(answer['error'])
    if not isinstance(answer.get('text'), str):
        protocol_violation('llm_result %r has neither a text nor an error string'
                           % answer.get('id'))
    return answer['text']


def llm_query_batched(prompts, model=None):
    """Asks for several prompts at once; returns, in order, a str or an Exception each."""
    if not isinstance(prompts, (list, tuple)) or \
            not all(isinstance(p, str) for p in prompts):
        raise TypeError('prompts must be a list of str')
    if len(prompts) > MAX_BATCH:
        raise ValueError('llm_query_batched takes at most %d prompts, not %d'
                         % (MAX_BATCH, len(prompts)))
    check_model(model)
    if not prompts:
        return []
    answer = SESSION.channel.query(
        {'type': 'llm_query_batched', 'prompts': list(prompts), 'model': model})
    items = answer.get('items')
    if not isinstance(items, list) or len(items) != len(prompts):
        protocol_violation('llm_results %r does not have one item per prompt' % answer.get('id'))
    results = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get('error'), str):
            results.append(RuntimeError(item['error']))
        elif isinstance(item, dict) and isinstance(item.get('text'), str):
            results.append(item['text'])
        else:
            protocol_violation('llm_results %r has an item with neither text nor error'
                               % answer.get('id'))
    return results


def json_shape(value):
    """(depth, values) of a JSON value: how deep lists and dicts nest (a scalar is 0), and how
    many values it holds (every scalar, list and dict), without recursion."""
    depth, values, stack = 0, 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        values += 1
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in item)
    return depth, values


def safe_repr(value) -> str:
    try:
        return repr(value)
    except RecursionError:
        return '<a %s nested too deep to show>' % type(value).__name__


def final_value(value) -> dict:
    """A copy taken now: the cell may change the object before the result is sent. A value that
    is not JSON, or nests deeper or holds more values than the host takes, is sent as its
    repr()."""
    try:
        copy = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return {'value': safe_repr(value)}
    depth, values = json_shape(copy)
    if depth > MAX_FINAL_DEPTH or values > MAX_FINAL_VALUES:
        return {'value': safe_repr(value)}
    return {'value': copy}


def FINAL(value):
    """Sets the session's final answer (sent with this cell's result)."""
    SESSION.final = final_value(value)


def FINAL_VAR(name):
    """FINAL(the variable called name)."""
    if not isinstance(name, str):
        raise TypeError('FINAL_VAR takes a variable name (a str)')
    caller = sys._getframe(1)
    for scope in (caller.f_locals, SESSION.namespace):
        if name in scope:
            SESSION.final = final_value(scope[name])
            return
    raise NameError('FINAL_VAR: no variable named %r' % name)


def SHOW_VARS():
    """Prints and returns {name: type name} of the variables the cells have made."""
    table = VarTable()
    for name, value in SESSION.namespace.items():
        if name.startswith('_') or isinstance(value, types.ModuleType):
            continue
        if name in SESSION.api and SESSION.api[name] is value:
            continue
        table[name] = type(value).__name__
    if table:
        print('\n'.join('%s: %s' % item for item in table.items()))
    else:
        print('(no variables)')
    return table


def make_namespace(context) -> dict:
    # A real module registered as __main__, so pickle finds classes and functions cells define.
    module = types.ModuleType('__main__')
    namespace = module.__dict__
    namespace['__builtins__'] = builtins
    SESSION.api = {'context': context, 'llm_query': llm_query,
                   'llm_query_batched': llm_query_batched, 'FINAL': FINAL,
                   'FINAL_VAR': FINAL_VAR, 'SHOW_VARS': SHOW_VARS}
    namespace.update(SESSION.api)
    sys.modules['__main__'] = module
    return namespace


# --------------------------------------------------------------------------------------------
# The standby


def execute_op(op: dict):
    """(code, output_cap) of an execute op, or a protocol error."""
    code, cap = op.get('code'), op.get('output_cap', DEFAULT_OUTPUT_CAP)
    if not is_op_id(op.get('id')) or not isinstance(code, str):
        protocol_violation('execute needs an id and a code string')
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        protocol_violation('execute output_cap must be a non-negative integer')
    return code, cap


def serve(channel: Channel) -> None:
    """The standby's loop: the cell runs here, in-process; then this process forks the next
    standby and becomes the checkpoint, and only the new standby comes back here. Each
    process leaves this loop only by exiting."""
    while True:
        op = channel.next_op()
        kind, op_id = op.get('op'), op.get('id')
        if kind == 'execute':
            code, cap = execute_op(op)
            fit_cell_result(channel, run_cell(channel, op_id, code, cap))
            # The host takes the result first; the next standby's fork (a page-table copy of
            # the whole interpreter) would otherwise compete with it for the CPU.
            time.sleep(HANDOVER_PAUSE)
            channel = become_checkpoint(channel, op_id)
        elif kind == 'rollback' and was_rolled_back(op_id):
            continue  # stale: the rollback it crossed was already taken
        else:
            protocol_violation('unexpected op %r for the standby' % kind)


# --------------------------------------------------------------------------------------------
# Start-up


class Config:
    def __init__(self):
        self.fd = env_int('RLM_SANDBOX_FD', None)
        path = os.environ.get('RLM_SANDBOX_SOCKET')
        if self.fd is None and path:
            # The Docker backend: a socket the host listens on, in a bind-mounted directory.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError as exc:
                raise StartupError('cannot connect to RLM_SANDBOX_SOCKET=%s (%s)'
                                   % (path, exc)) from None
            self.fd = sock.detach()
        if self.fd is None:
            raise StartupError('neither RLM_SANDBOX_FD nor RLM_SANDBOX_SOCKET is set')
        try:
            mode = os.fstat(self.fd).st_mode
        except OSError as exc:
            raise StartupError('RLM_SANDBOX_FD=%d is not open (%s)' % (self.fd, exc)) from None
        if not stat.S_ISSOCK(mode):
            raise StartupError('RLM_SANDBOX_FD=%d is not a socket' % self.fd)
        self.token = os.environ.get('RLM_SANDBOX_TOKEN', '')
        if not self.token:
            raise StartupError('RLM_SANDBOX_TOKEN is not set')
        self.max_frame = env_int('RLM_SANDBOX_MAX_FRAME', DEFAULT_MAX_FRAME)
        if self.max_frame < 1024:
            raise StartupError('RLM_SANDBOX_MAX_FRAME must be at least 1024')
        self.context_fd = env_int('RLM_SANDBOX_CONTEXT_FD', None)
        context_file = os.environ.get('RLM_SANDBOX_CONTEXT_FILE')
        if self.context_fd is None and context_file:
            try:
                self.context_fd = os.open(context_file, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise StartupError('cannot open RLM_SANDBOX_CONTEXT_FILE=%s (%s)'
                                   % (context_file, exc)) from None
        self.context_format = os.environ.get('RLM_SANDBOX_CONTEXT_FORMAT') or 'text'
        if self.context_format not in ('text', 'json'):
            raise StartupError('RLM_SANDBOX_CONTEXT_FORMAT must be text or json, not %r'
                               % self.context_format)


def env_int(name: str, default):
    value = os.environ.get(name)
    if value is None or value == '':
        return default
    try:
        return int(value)
    except ValueError:
        raise StartupError('%s=%r is not an integer' % (name, value)) from None


def read_all(fd: int) -> bytes:
    """From offset 0 when the fd can seek (a memfd the host wrote is left at its end)."""
    chunks, offset = [], 0
    try:
        while True:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                return b''.join(chunks)
            chunks.append(chunk)
            offset += len(chunk)
    except OSError as exc:
        if chunks or exc.errno != errno.ESPIPE:  # a pipe: read it in order
            raise
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b''.join(chunks)
        chunks.append(chunk)


def load_context(config: Config):
    """(context, bytes read)."""
    if config.context_fd is None:
        return None, 0
    try:
        raw = read_all(config.context_fd)
        os.close(config.context_fd)
    except OSError as exc:
        raise StartupError('cannot read the context from fd %d (%s)' % (config.context_fd, exc))
    if config.context_format == 'text':
        return raw.decode('utf-8', 'replace'), len(raw)
    try:
        return json.loads(raw.decode('utf-8')), len(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StartupError('the context is not valid JSON (%s)' % exc) from None


def become_subreaper() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        if libc.prctl(ctypes.c_int(pr_set_child_subreaper), ctypes.c_ulong(1),
                      ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (ImportError, OSError, AttributeError) as exc:
        # Orphans then go to the sandbox's init instead; rollback cannot find them.
        diag('cannot become a child subreaper (%s): a rollback may leave processes behind' % exc)


def scrub_environment() -> None:
    """Removes RLM_SANDBOX_* from os.environ, and blanks the token in the process's original
    environment block too, which /proc/self/environ would otherwise show every cell."""
    prefix = b'RLM_SANDBOX_TOKEN='
    try:
        import ctypes
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), 'environ')
        i = 0
        while environ[i]:
            entry = ctypes.string_at(environ[i])
            if entry.startswith(prefix):
                ctypes.memset(environ[i] + len(prefix), 0, len(entry) - len(prefix))
            i += 1
    except (ImportError, OSError, AttributeError, ValueError):
        pass  # os.environ below still hides it from os.environ and subprocesses
    for name in [n for n in os.environ if n.startswith('RLM_SANDBOX_')]:
        del os.environ[name]


def first_interpreter(config: Config, token: str) -> None:
    raise_oom_score()
    try:
        context, context_length = load_context(config)
    except StartupError as exc:
        die(str(exc), EXIT_STARTUP)
    os.set_inheritable(config.fd, False)  # cells' subprocesses must not get the channel
    channel = Channel(socket.socket(fileno=config.fd), config.max_frame)
    SESSION.channel = channel
    SESSION.namespace = make_namespace(context)
    try:
        # Line buffering keeps print() and subprocess output in order in a cell's stdout.
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    version = '%d.%d.%d' % sys.version_info[:3]
    channel.send({'type': 'hello', 'token': token, 'pid': os.getpid(), 'python': version,
                  'context_length': context_length})
    serve(become_checkpoint(channel, 0))


def reap_until_alone(first_pid: int) -> int:
    """The root's exit status: the first interpreter's exit code when it failed (start-up or
    protocol error; it never runs cells itself), else 0."""
    status_of_first = None
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == first_pid:
            status_of_first = status
    if status_of_first is not None and os.WIFEXITED(status_of_first):
        return os.WEXITSTATUS(status_of_first)
    return 0


def main() -> None:
    global DIAG_FD, ROOT_PID
    # Python 3.12+ warns about forking a threaded process; forking is the design here.
    warnings.filterwarnings('ignore', category=DeprecationWarning, message='.*fork')
    try:
        DIAG_FD = os.dup(2)
    except OSError:
        DIAG_FD = -1
    try:
        config = Config()
    except StartupError as exc:
        die(str(exc), EXIT_STARTUP)
    token = config.token
    scrub_environment()
    become_subreaper()
    ROOT_PID = os.getpid()
    make_undumpable()  # inherited by every interpreter
    # The root shares a process group with the first interpreter (and, on the namespace backend,
    # with init) that no member anchors: a cell could orphan it with a stopped member of its own
    # in it, and the kernel would SIGHUP the whole group. Neither runs cells; each standby
    # restores the default before its cell (fork_standby).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    flush_std_streams()
    pid = os.fork()
    if pid == 0:
        try:
            first_interpreter(config, token)
        except BaseException as exc:  # a worker bug: say so, never fall back into the root
            die('worker failure: %s' % ''.join(traceback.format_exception(
                type(exc), exc, exc.__traceback__)), EXIT_STARTUP)
        os._exit(0)
    for fd in (config.fd, config.context_fd):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    os._exit(reap_until_alone(pid))


if __name__ == '__main__':
    main()
