# The control channel: framing, the one reader at a time, llm answers filed by id, fds tied to
# the frame they came with.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import array
import collections
import json
import os
import select
import socket
import struct
import threading
import time

CHILD_POLL_SECONDS = 0.01  # only when os.pidfd_open is unavailable
HEADER = struct.Struct('>I')
BULK_BIT = 0x80000000  # a header with this bit is a bulk frame's (raw UTF-8, no JSON)
BULK_MIN = 1 << 16     # strings this long (in characters) travel as bulk frames
FD_ROOM = socket.CMSG_SPACE(struct.calcsize('i'))  # one fd per message; the kernel closes more


class FrameTooLarge(Exception):
    pass


class HostFrame(dict):
    """A frame from the host, and the fd that came with it (attached to its first bytes), if
    any: the op that takes an fd takes it with take_fd(); close_fd() closes one nobody took."""

    fd = None

    def take_fd(self):
        fd, self.fd = self.fd, None
        return fd

    def close_fd(self) -> None:
        fd = self.take_fd()
        if fd is not None:
            os.close(fd)


def encode_frame(message: dict) -> bytes:
    # ensure_ascii=False keeps frames small; lone surrogates a cell may produce become '?' so
    # the frame stays valid UTF-8. NaN/Infinity are not JSON, so they are refused.
    text = json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(',', ':'))
    return text.encode('utf-8', 'replace')


UTF8_VIEW = []  # [PyUnicode_AsUTF8AndSize] once ctypes has been tried; [None] without it


def utf8_view(text: str):
    """The UTF-8 bytes of an ASCII str without copying them (CPython keeps an ASCII string's
    characters as its UTF-8; PyUnicode_AsUTF8AndSize returns them in place): a 50 MB prompt's
    encode() cost more than its whole trip to the host. None for other strings (their UTF-8
    would be cached in the str, doubling it) or without ctypes; the caller encodes then. The
    view is valid while `text` lives: the caller's message holds it until the send is done."""
    if not text.isascii():
        return None
    if not UTF8_VIEW:
        try:
            import ctypes
            function = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
            function.restype = ctypes.c_void_p
            function.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)]
            UTF8_VIEW.append((ctypes, function))
        except (ImportError, AttributeError):
            UTF8_VIEW.append(None)
    if UTF8_VIEW[0] is None:
        return None
    ctypes, function = UTF8_VIEW[0]
    size = ctypes.c_ssize_t()
    address = function(text, ctypes.byref(size))
    if not address or size.value != len(text):
        return None
    return memoryview((ctypes.c_char * size.value).from_address(address)).cast('B')


def split_bulk(message: dict, bulk: list) -> dict:
    """The message with each long string of a top-level field (or of a top-level list) replaced
    by a {"$bulk": i} placeholder, its UTF-8 bytes appended to bulk: JSON-escaping and parsing
    tens of megabytes costs far more than copying them (docs/control-channel.md)."""
    def take(value):
        if isinstance(value, str) and len(value) >= BULK_MIN:
            bulk.append(utf8_view(value) or value.encode('utf-8', 'replace'))
            return {'$bulk': len(bulk) - 1}
        return value

    if not any(isinstance(v, str) and len(v) >= BULK_MIN or isinstance(v, list)
               for v in message.values()):
        return message
    split = {key: [take(item) for item in value] if isinstance(value, list) else take(value)
             for key, value in message.items()}
    if bulk:
        split['bulk'] = len(bulk)
        return split
    return message


def take_frame(buffer: bytearray, max_frame: int):
    """The body of the first frame in buffer, removed from it with its header; None while the
    frame is incomplete. A length over max_frame is a protocol violation (a bulk frame's too:
    the host sends none)."""
    if len(buffer) < HEADER.size:
        return None
    (length,) = HEADER.unpack_from(buffer)
    if length > max_frame:
        protocol_violation('a frame of %d bytes exceeds the maximum of %d bytes'
                           % (length, max_frame))
    if len(buffer) < HEADER.size + length:
        return None
    body = bytes(buffer[HEADER.size:HEADER.size + length])
    del buffer[:HEADER.size + length]
    return body


def decode_frame(body: bytes) -> HostFrame:
    try:
        message = json.loads(body.decode('utf-8'))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        protocol_violation('a frame from the host is not UTF-8 JSON (%s)' % exc)
    if not isinstance(message, dict):
        protocol_violation('a frame from the host is not a JSON object')
    return HostFrame(message)


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
        # Where fds came in: (start, end, fds) of each read that brought some, in stream
        # offsets; _offset is the stream offset of _buffer[0].
        self._offset = 0
        self._fd_reads = collections.deque()
        # Wakes a reader blocked in poll() when the cell ends, so it re-checks its wait.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def close(self) -> None:
        """Drops this process's copy of the channel (never shuts the connection down)."""
        fds = [self._wake_r, self._wake_w]
        for _, _, received in self._fd_reads:
            fds.extend(received)
        fds.extend(op.take_fd() for op in self._ops if op.fd is not None)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.sock.close()

    # -- sending

    def send(self, message: dict, fd: int = -1) -> None:
        """Sends one frame; with fd, attaches it to the frame's first byte (SCM_RIGHTS).
        Long strings (a top-level field's, or an item of a top-level list) travel as bulk
        frames before it, unescaped."""
        bulk = []
        if fd < 0:
            message = split_bulk(message, bulk)
        data = encode_frame(message)
        size = len(data) + sum(len(item) for item in bulk)
        if size > self.max_frame:
            raise FrameTooLarge(size)
        header = HEADER.pack(len(data))
        try:
            with self._send_lock:
                for item in bulk:
                    self.sock.sendall(HEADER.pack(len(item) | BULK_BIT))
                    self.sock.sendall(item)
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
            chunk, ancillary, _, _ = self.sock.recvmsg(want, FD_ROOM)
        except OSError:
            chunk, ancillary = b'', []
        received = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array('i')
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                received.extend(fds)
        if not chunk:
            os._exit(0)  # EOF: the host is done with this interpreter
        start = self._offset + len(self._buffer)
        if received:
            self._fd_reads.append((start, start + len(chunk), received))
        self._buffer += chunk
        while True:
            body = take_frame(self._buffer, self.max_frame)
            if body is None:
                return
            frame_start, self._offset = self._offset, self._offset + HEADER.size + len(body)
            frame = decode_frame(body)
            frame.fd = self._fd_of_frame(frame_start, self._offset)
            self._file(frame)

    def _fd_of_frame(self, start: int, end: int):
        """The fd that came with the frame at stream offsets [start, end), or None. The host
        attaches an fd to a frame's first bytes, and the kernel ends a read at the bytes an fd
        came with, so an fd belongs to the last frame that starts within the read that brought
        it; the fds of a read in which no frame starts are closed."""
        mine = []
        while self._fd_reads and self._fd_reads[0][1] <= end:
            read_start, read_end, fds = self._fd_reads.popleft()
            if read_start <= start < read_end:
                mine.extend(fds)  # no later frame starts in this read
            else:
                for fd in fds:
                    os.close(fd)
        for extra in mine[1:]:
            os.close(extra)
        return mine[0] if mine else None

    def _file(self, frame: HostFrame) -> None:
        op = frame.get('op')
        if op not in ('handover', 'add_context', 'save', 'load'):
            frame.close_fd()  # only these ops take an fd
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

    def next_op(self) -> HostFrame:
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

    def has_input(self, timeout: float) -> bool:
        """Whether a frame (or its first bytes) waits, read or not, or comes within timeout
        seconds."""
        return bool(self._ops) or bool(self._buffer) or self._socket_ready(timeout * 1000)

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
