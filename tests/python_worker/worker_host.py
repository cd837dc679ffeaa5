"""The host side for the tests of the Python REPL worker (worker/python/): the test_*.py files
here use it to play the host.

Each test starts `python3 -I -S -c <worker source>` on one end of a socketpair (as the runtime
does, but unsandboxed) and speaks docs/control-channel.md to it: framing, fork frames carrying
the next standby's channel (forked between cells, unasked), discard, commit, rollback and
restore. The worker source is the script the runtime embeds: $RLM_WORKER_SOURCE (ctest passes
the build's), else the parts of worker/python/ concatenated here the same way.
"""

import array
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS_DIR = os.path.join(HERE, '..', '..', 'worker', 'python')


def worker_parts():
    """The worker's part files, in the order of worker/python/parts.txt."""
    with open(os.path.join(PARTS_DIR, 'parts.txt'), encoding='utf-8') as listing:
        names = [line.strip() for line in listing if line.strip() and line[0] != '#']
    return [os.path.join(PARTS_DIR, name) for name in names]


def concatenate_parts():
    """The worker script as runtime/session/embed_worker.cmake makes it: the parts in order, two
    blank lines between two."""
    texts = []
    for path in worker_parts():
        with open(path, encoding='utf-8') as part:
            texts.append(part.read())
    return '\n\n'.join(texts)


SOURCE_PATH = os.environ.get('RLM_WORKER_SOURCE')
if SOURCE_PATH:
    with open(SOURCE_PATH, encoding='utf-8') as source_file:
        SOURCE = source_file.read()
else:
    SOURCE = concatenate_parts()
PYTHON = os.environ.get('RLM_TEST_PYTHON', 'python3')
TOKEN = '5eed' * 8
IO_TIMEOUT = 30.0  # generous: a loaded machine is slow, a hang still fails


# --------------------------------------------------------------------------------------------
# The host side of the channel


def read_exact(sock, n, fds):
    data = bytearray()
    while len(data) < n:
        chunk, ancillary, _, _ = sock.recvmsg(n - len(data), socket.CMSG_SPACE(16))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array('i')
                received.frombytes(payload[:len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        if not chunk:
            raise EOFError('the worker closed the channel')
        data += chunk
    return bytes(data)


BULK_BIT = 0x80000000


def read_frame(sock):
    """(message, fds received with it); bulk frames before it put where its placeholders are."""
    fds, bulk = [], []
    while True:
        (length,) = struct.unpack('>I', read_exact(sock, 4, fds))
        if not length & BULK_BIT:
            break
        bulk.append(read_exact(sock, length & ~BULK_BIT, fds).decode('utf-8'))
    message = json.loads(read_exact(sock, length, fds))
    if bulk:
        assert message.pop('bulk') == len(bulk)

        def put(value):
            if isinstance(value, dict) and list(value) == ['$bulk']:
                return bulk[value['$bulk']]
            return value

        message = {key: [put(item) for item in value] if isinstance(value, list) else put(value)
                   for key, value in message.items()}
    return message, fds


def write_frame(sock, message, fd=None):
    """One frame; with fd, attached (SCM_RIGHTS) to its first byte."""
    body = json.dumps(message).encode()
    data = struct.pack('>I', len(body)) + body
    if fd is not None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', fd))]
        sent = sock.sendmsg([data[:4]], rights)
        data = data[sent:]
    sock.sendall(data)


def answer_for(prompt, kind='llm'):
    """The fake host's LM (kind llm) and sub-RLM (kind rlm): a prompt starting FAIL fails; a
    message list is answered with its contents joined."""
    if isinstance(prompt, list):
        prompt = '|'.join('%s=%s' % (m['role'], m['content']) for m in prompt)
    if prompt.startswith('FAIL'):
        return {'error': 'model failed on ' + prompt}
    return {'text': ('echo:' if kind == 'llm' else 'rlm:') + prompt}


def tool_answer(name, call):
    """The fake host's tools: `fail` fails, `garbage` answers text that is not JSON, any other
    returns what it was called with."""
    if name == 'fail':
        return {'error': 'tool fail refused %r' % (call['args'],)}
    if name == 'garbage':
        return {'text': '{not json'}
    return {'text': json.dumps({'tool': name, 'args': call['args'], 'kwargs': call['kwargs']})}


def answer_query(frame):
    """The llm_result fields for an llm_query frame of any kind."""
    kind = frame.get('kind', 'llm')
    if kind == 'tool':
        return tool_answer(frame['tool'], frame['prompt'])
    return answer_for(frame['prompt'], kind)


# --------------------------------------------------------------------------------------------
# Processes


def proc_stat(pid):
    """(ppid, state) or None."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as f:
            line = f.read()
    except OSError:
        return None
    fields = line[line.rfind(b')') + 2:].split()
    return int(fields[1]), fields[0].decode()


def cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().decode('utf-8', 'replace')
    except OSError:
        return ''


def is_gone(pid):
    stat = proc_stat(pid)
    return stat is None or stat[1] in ('Z', 'X')


def descendants(root):
    """Live processes whose parent chain reaches root."""
    parents = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat[1] not in ('Z', 'X'):
                parents[int(name)] = stat[0]
    found = []
    for pid in parents:
        seen, cur = set(), parents.get(pid)
        while cur is not None and cur not in seen:
            if cur == root:
                found.append(pid)
                break
            seen.add(cur)
            cur = parents.get(cur)
    return found


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class Worker:
    """A worker process tree and the host's ends of its channels."""

    def __init__(self, workdir, source=SOURCE, context=None, context_format=None,
                 context_via_pipe=False, max_frame=None, drop_env=(), extra_env=None):
        host, guest = socket.socketpair()
        env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
               'RLM_SANDBOX_FD': str(guest.fileno()), 'RLM_SANDBOX_TOKEN': TOKEN}
        if max_frame is not None:
            env['RLM_SANDBOX_MAX_FRAME'] = str(max_frame)
        self.max_frame = max_frame or 16 * 1024 * 1024
        pass_fds = [guest.fileno()]
        self.context = context
        self.context_format = context_format or 'text'
        self.context_via_pipe = context_via_pipe
        env.update(extra_env or {})
        for name in drop_env:
            env.pop(name, None)
        self.output = tempfile.TemporaryFile(dir=workdir)
        self.stderr = tempfile.TemporaryFile(dir=workdir)
        self.proc = subprocess.Popen(
            [PYTHON, '-I', '-S', '-c', source], env=env, pass_fds=pass_fds, cwd=workdir,
            stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.stderr,
            start_new_session=True)
        guest.close()
        host.settimeout(IO_TIMEOUT)
        self.first = host          # the first interpreter's channel
        self.checkpoint = None     # the armed checkpoint's channel
        self.standby = host        # where the next execute goes (the first channel until hello)
        self.standby_pid = None
        self.snapshots = set()     # checkpoints the host keeps (commit instead of discard)
        self.sockets = [host]
        self.next_id = 0
        self.queries = []          # every llm_query / llm_query_batched frame served

    # -- lifecycle

    def hello(self, hand_over=True):
        """hello and the first standby (fork id 0); then (hand_over) the hand-over."""
        frame, fds = read_frame(self.first)
        self.assert_type(frame, 'hello')
        self.checkpoint = self.first
        self.expect_fork(self.first, 0)
        if hand_over:
            reply = self.hand_over()
            if 'error' in reply:
                raise AssertionError('the hand-over failed: %r' % reply)
        return frame

    def context_fd(self):
        """The context as the runtime passes it: a memfd left at its end, or a pipe."""
        if self.context is None:
            return None
        data = self.context if isinstance(self.context, bytes) else self.context.encode()
        if self.context_via_pipe:
            read_end, write_end = os.pipe()
            os.write(write_end, data)
            os.close(write_end)
            return read_end
        fd = os.memfd_create('context')
        os.write(fd, data)
        return fd

    def hand_over(self, op_id=0, reply=True, **fields):
        """The hand-over frame to the first checkpoint and to the standby, each with the
        context's fd attached to its first byte; returns the standby's handed_over frame."""
        message = {'op': 'handover', 'id': op_id, 'max_frame': self.max_frame,
                   'context': None if self.context is None else self.context_format}
        message.update(fields)
        for sock in (self.checkpoint, self.standby):
            fd = self.context_fd()
            try:
                write_frame(sock, message, fd)
            finally:
                if fd is not None:
                    os.close(fd)
        if not reply:
            return None
        frame, _ = read_frame(self.standby)
        self.assert_type(frame, 'handed_over')
        if frame['id'] != op_id:
            raise AssertionError('handed_over %r, expected id %r' % (frame, op_id))
        return frame

    def wait_exit(self, timeout=IO_TIMEOUT):
        return self.proc.wait(timeout)

    def stderr_text(self):
        self.stderr.seek(0)
        return self.stderr.read().decode('utf-8', 'replace')

    def kill(self):
        """Kills the whole tree: the root is a subreaper, so every straggler is below it."""
        for _ in range(100):
            victims = descendants(self.proc.pid)
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(IO_TIMEOUT)
        for sock in self.sockets:
            sock.close()
        self.output.close()
        self.stderr.close()

    # -- frames

    @staticmethod
    def assert_type(frame, kind):
        if frame.get('type') != kind:
            raise AssertionError('expected a %s frame, got %r' % (kind, frame))

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def expect_fork(self, sock, fork_id):
        """Reads the fork frame on sock (whose process is now the armed checkpoint) and takes
        the new standby's channel."""
        frame, fds = read_frame(sock)
        self.assert_type(frame, 'fork')
        if frame['id'] != fork_id or len(fds) != 1 or not isinstance(frame['pid'], int):
            raise AssertionError('bad fork frame %r with fds %r' % (frame, fds))
        child = socket.socket(fileno=fds[0])
        child.settimeout(IO_TIMEOUT)
        self.sockets.append(child)
        self.checkpoint = sock
        self.standby = child
        self.standby_pid = frame['pid']
        return child

    def begin(self, code, output_cap=1 << 20, **fields):
        """Sends execute (with any further fields: locals, fetch) to the standby; returns (op
        id, checkpoint channel, cell channel)."""
        op_id = self.new_id()
        message = {'op': 'execute', 'id': op_id, 'code': code, 'output_cap': output_cap}
        message.update(fields)
        write_frame(self.standby, message)
        return op_id, self.checkpoint, self.standby

    def serve_cell(self, op_id, child):
        """Answers llm requests until cell_result."""
        while True:
            frame, _ = read_frame(child)
            kind = frame.get('type')
            if kind == 'llm_query':
                self.queries.append(frame)
                write_frame(child, dict(op='llm_result', id=frame['id'], **answer_query(frame)))
            elif kind == 'llm_query_batched':
                self.queries.append(frame)
                items = [answer_for(p, frame.get('kind', 'llm')) for p in frame['prompts']]
                write_frame(child, {'op': 'llm_results', 'id': frame['id'], 'items': items})
            else:
                self.assert_type(frame, 'cell_result')
                if frame['id'] != op_id:
                    raise AssertionError('cell_result for %r, expected %r' % (frame, op_id))
                return frame

    def close(self, sock):
        sock.close()
        self.sockets.remove(sock)

    def discard(self, sock):
        write_frame(sock, {'op': 'discard'})
        self.close(sock)

    def release(self, checkpoint):
        """What the host tells a checkpoint it no longer needs as one: commit to a snapshot
        (it stays frozen for good, its channel open), else discard."""
        if checkpoint in self.snapshots:
            write_frame(checkpoint, {'op': 'commit'})
        else:
            self.discard(checkpoint)

    def finish(self, op_id, parent, child):
        """After the cell_result: lets the old checkpoint go; the cell's process forks the
        next standby unasked and is the checkpoint now."""
        self.release(parent)
        self.expect_fork(child, op_id)

    def execute(self, code, output_cap=1 << 20, **fields):
        op_id, parent, child = self.begin(code, output_cap, **fields)
        result = self.serve_cell(op_id, child)
        self.finish(op_id, parent, child)
        return result

    def add_context(self, data, kind='context', data_format='text', index=None):
        """add_context with data (bytes or str) in a memfd attached: answered like a cell."""
        op_id = self.new_id()
        fd = os.memfd_create('added')
        try:
            os.write(fd, data if isinstance(data, bytes) else data.encode())
            write_frame(self.standby, {'op': 'add_context', 'id': op_id, 'index': index,
                                       'kind': kind, 'format': data_format}, fd)
        finally:
            os.close(fd)
        parent, child = self.checkpoint, self.standby
        result = self.serve_cell(op_id, child)
        self.finish(op_id, parent, child)
        return result

    def expect_rolled_back(self, parent, op_id):
        """After the cell's channel ended or the host's rollback: the checkpoint reports and
        forks a new standby (same id)."""
        frame, _ = read_frame(parent)
        self.assert_type(frame, 'rolled_back')
        if frame['id'] != op_id:
            raise AssertionError('rolled_back %r, expected id %r' % (frame, op_id))
        self.close(self.standby)
        self.expect_fork(parent, op_id)
        return frame

    def snapshot(self):
        """Marks the current checkpoint as a snapshot (host-side only); returns its channel."""
        self.snapshots.add(self.checkpoint)
        return self.checkpoint

    def restore(self, snapshot):
        op_id = self.new_id()
        if self.checkpoint is not snapshot:
            self.release(self.checkpoint)
        else:
            write_frame(snapshot, {'op': 'commit'})
        self.discard(self.standby)
        write_frame(snapshot, {'op': 'restore', 'id': op_id})
        self.expect_fork(snapshot, op_id)
        return op_id


# A cell's view of its own descriptors: exactly one socket (its channel) and no pidfd of a
# checkpoint, else a cell could speak for its checkpoint or keep its EOF from the host.
FD_KINDS_CODE = (
    "import os\n"
    "_links = []\n"
    "for _n in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        _links.append(os.readlink('/proc/self/fd/' + _n))\n"
    "    except OSError:\n"
    "        pass  # the listing's own descriptor\n"
    "(sum(l.startswith('socket:') for l in _links), sum('pidfd' in l for l in _links))")


class WorkerTestCase(unittest.TestCase):
    source = SOURCE

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.workers = []

    def tearDown(self):
        for worker in self.workers:
            worker.kill()
        self.tmp.cleanup()

    def start(self, hello=True, **kwargs):
        kwargs.setdefault('source', self.source)
        worker = Worker(self.tmp.name, **kwargs)
        self.workers.append(worker)
        if hello:
            worker.hello_frame = worker.hello()
        return worker

    def run_ok(self, worker, code, **kwargs):
        result = worker.execute(code, **kwargs)
        self.assertEqual(result['status'], 'ok', result['error'])
        return result

    def stdout_of(self, worker, code):
        return self.run_ok(worker, code)['stdout']
