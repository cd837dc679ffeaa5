# A cell: its output captured from fds 1 and 2, its code run like interactive input, its
# traceback trimmed of the worker's frames, its result fitted into one frame.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import _thread
import ast
import gc
import linecache
import os
import resource
import select
import sys
import threading
import traceback

DEFAULT_OUTPUT_CAP = 1024 * 1024
CELL_FILE = '<cell>'
WORKER_FILE = (lambda: None).__code__.co_filename  # '<string>' under `python3 -c`


def fd_identity(fd: int):
    """(device, inode) of what fd refers to: a cell sees the worker's fds while it runs and may
    close one and reuse its number, so the worker checks a number still names its own pipe
    before it reads or closes it."""
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def close_if_same(fd: int, identity) -> None:
    try:
        if fd_identity(fd) == identity:
            os.close(fd)
    except OSError:
        pass


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
        self.pipe = fd_identity(self.read_fd)  # both ends of a pipe share it
        self.saved = -1

    def activate(self, cap: int) -> None:
        self.cap = cap
        self.saved = os.dup(self.fd)
        os.dup2(self.write_fd, self.fd)  # inheritable: subprocesses write here too
        os.close(self.write_fd)
        self.write_fd = -1

    def read_some(self, max_reads: int) -> None:
        """Reads what the pipe holds (at most max_reads chunks); at EOF marks it closed, and
        also when its number no longer names the pipe (a cell closed it)."""
        try:
            if fd_identity(self.read_fd) != self.pipe:
                self.open = False
                return
        except OSError:
            self.open = False
            return
        for _ in range(max_reads):
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                self.open = False
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

    def close(self) -> None:
        close_if_same(self.read_fd, self.pipe)
        if self.write_fd >= 0:  # never activated: the write end is still ours
            close_if_same(self.write_fd, self.pipe)

    def text(self):
        return bytes(self.data).decode('utf-8', 'replace'), self.truncated


class OutputCapture:
    """Points fds 1 and 2 at pipes drained by one thread for the duration of a cell. Made (pipes
    and thread) by a standby while it waits; activate() is all a cell pays for.

    With cells sent back to back a standby is made and its first cell arrives at once, so the
    cell's path does not wait for the thread: it is started without the handshake
    threading.Thread.start() makes, and finish() takes the rest of the pipes itself under the
    lock instead of joining it. Each of those waits was a switch between threads, 0.2-0.4 ms
    here. The thread ends when the stop pipe wakes it; its fds are closed once it has ended,
    by close_finished_captures() before the next fork (a child must not inherit them, and no
    number may be closed while the thread could still poll it). A capture no cell used (the
    standby ran add_context, save or load) is retired the same way."""

    def __init__(self):
        self.streams = (CapturedStream(1), CapturedStream(2))
        self.stop_r, self.stop_w = os.pipe()
        self.stop_pipe = fd_identity(self.stop_r)
        self.lock = threading.Lock()
        self.stopped = False
        self.ended = _thread.allocate_lock()
        self.ended.acquire()  # released by the thread as it ends
        _thread.start_new_thread(self._drain, ())

    def activate(self, cap: int) -> 'OutputCapture':
        for stream in self.streams:
            stream.activate(cap)
        return self

    def _drain(self) -> None:
        try:
            poller = select.poll()
            by_fd = {}
            for stream in self.streams:
                poller.register(stream.read_fd, select.POLLIN)
                by_fd[stream.read_fd] = stream
            poller.register(self.stop_r, select.POLLIN)
            while True:
                events = poller.poll()
                with self.lock:
                    # The stop pipe readable also ends it: a byte a cell wrote there must not
                    # leave the thread spinning (finish() takes the pipes itself anyway).
                    if self.stopped or any(fd == self.stop_r for fd, _ in events):
                        return
                    for fd, event in events:
                        stream = by_fd.get(fd)
                        if stream is None:
                            continue
                        if event & select.POLLNVAL:  # a cell closed it: never poll it again
                            stream.open = False
                        else:
                            stream.read_some(16)
                        if not stream.open:
                            poller.unregister(fd)
                            del by_fd[fd]
        finally:
            self.ended.release()

    def _stop(self) -> None:
        """Under the lock: nothing more is read by the thread, and it is woken to end."""
        self.stopped = True
        try:
            if fd_identity(self.stop_w) == self.stop_pipe:
                os.write(self.stop_w, b'.')
        except OSError:
            pass
        FINISHED_CAPTURES.append(self)

    def finish(self):
        """Puts fds 1 and 2 back; ((stdout, truncated), (stderr, truncated)). What is already in
        the pipes is taken, but EOF is not waited for, which a background process holding a
        pipe could delay for ever."""
        for stream in self.streams:
            stream.restore()
        with self.lock:
            for stream in self.streams:
                if stream.open:
                    stream.read_some(64)
            self._stop()
        return tuple(stream.text() for stream in self.streams)

    def retire(self) -> None:
        """For a capture no cell used."""
        with self.lock:
            self._stop()

    def close(self) -> None:
        """Once the thread has ended: closes the pipes. A thread that does not end within a
        second (a cell took its stop pipe away) keeps them: a leak in this interpreter's line,
        never a number closed under a thread that may still poll it."""
        if not self.ended.acquire(timeout=1.0):
            return
        close_if_same(self.stop_r, self.stop_pipe)
        close_if_same(self.stop_w, self.stop_pipe)
        for stream in self.streams:
            stream.close()


FINISHED_CAPTURES = []


def close_finished_captures() -> None:
    """Waits for the drain threads of finished captures to end (they were woken at the cell's
    end, so they have usually ended) and closes their fds."""
    while FINISHED_CAPTURES:
        FINISHED_CAPTURES.pop().close()


def flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def run_source(code: str, namespace: dict, echo: bool = True) -> None:
    """Runs a cell like interactive input: with echo, a trailing expression's repr() is printed
    (SHOW_VARS()'s text as it is)."""
    tree = ast.parse(code, CELL_FILE, 'exec')
    linecache.cache[CELL_FILE] = (len(code), None, code.splitlines(True), CELL_FILE)
    last = None
    if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
    # dont_inherit: the worker's own compiler flags must not leak into cells.
    exec(compile(tree, CELL_FILE, 'exec', dont_inherit=True), namespace)
    if last is not None:
        expression = ast.Expression(last.value)
        value = eval(compile(expression, CELL_FILE, 'eval', dont_inherit=True), namespace)
        if value is not None and value is SESSION.shown_vars:
            print(value)
        elif value is not None:
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


def shrink_cell_result(result: dict) -> bool:
    """One step of making a result smaller: output first (flagged truncated), then the listed
    variables, the fetched value, the answer, the FINAL value, the traceback. False when nothing
    is left to shrink."""
    longest = max(('stdout', 'stderr'), key=lambda k: len(result[k]))
    if len(result[longest]) > 0:
        result[longest] = result[longest][:len(result[longest]) // 2]
        result[longest + '_truncated'] = True
    elif result.get('locals'):
        del result['locals'][len(result['locals']) // 2:]
    elif 'value' in result.get('fetched', ()):
        result['fetched'] = {'error': 'the value is too large for the control channel'}
    elif 'answer' in result or 'final' in result:
        what = 'answer' if 'answer' in result else 'final'
        del result[what]
        result['status'] = 'error'
        result['error'] = (result['error'] or '') + \
            'the %s value is too large for the control channel\n' % what.upper()
    elif result['error'] and len(result['error']) > 64:
        result['error'] = result['error'][:len(result['error']) // 2]
    else:
        return False
    return True


def fit_cell_result(channel: Channel, result: dict) -> None:
    """Sends the result, shrinking it until it fits in one frame."""
    while True:
        try:
            channel.send(result)
            return
        except FrameTooLarge:
            pass
        if not shrink_cell_result(result):
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


def run_cell(channel: Channel, op_id, code: str, output_cap: int, want_locals: bool = False,
             fetch=None) -> dict:
    me = os.getpid()
    begin_cell_globals()
    streams = sys.stdout, sys.stderr
    flush_std_streams()
    capture, SESSION.next_capture = SESSION.next_capture or OutputCapture(), None
    capture.activate(output_cap)
    before = cpu_seconds()
    channel.begin_cell()
    error = None
    try:
        run_source(code, SESSION.namespace, SESSION.echo)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the cell's own
        error = format_cell_error(exc)
    if os.getpid() != me:
        os._exit(0)  # a process the cell forked ran off the end of the cell
    channel.end_cell()
    result = {'type': 'cell_result', 'id': op_id, 'status': 'error' if error else 'ok'}
    end_cell_globals(result, want_locals, fetch)  # what it prints is the cell's output too
    flush_std_streams()  # the cell's streams, if it replaced them
    sys.stdout, sys.stderr = streams
    flush_std_streams()
    (stdout, stdout_truncated), (stderr, stderr_truncated) = capture.finish()
    after = cpu_seconds()
    gc.unfreeze()  # warm_up froze the state before the cell; it is collectable again
    result.update({
        'stdout': stdout, 'stderr': stderr,
        'stdout_truncated': stdout_truncated, 'stderr_truncated': stderr_truncated,
        'error': error,
        'cpu_ms': round((after - before) * 1000, 3),
    })
    if SESSION.final is not None:
        result['final'] = SESSION.final
    return result
