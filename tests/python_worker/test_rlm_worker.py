"""Tests for worker/python/rlm_worker.py, with this file playing the host.

Each test starts `python3 -I -S -c <worker source>` on one end of a socketpair (as the runtime
does, but unsandboxed) and speaks docs/control-channel.md to it: framing, fork frames carrying
the next standby's channel (forked between cells, unasked), discard, commit, rollback and
restore.
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
SOURCE_PATH = os.environ.get('RLM_WORKER_SOURCE') or \
    os.path.join(HERE, '..', '..', 'worker', 'python', 'rlm_worker.py')
with open(SOURCE_PATH, encoding='utf-8') as source_file:
    SOURCE = source_file.read()
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


def read_frame(sock):
    """(message, fds received with it)."""
    fds = []
    (length,) = struct.unpack('>I', read_exact(sock, 4, fds))
    return json.loads(read_exact(sock, length, fds)), fds


def write_frame(sock, message):
    data = json.dumps(message).encode()
    sock.sendall(struct.pack('>I', len(data)) + data)


def answer_for(prompt):
    if prompt.startswith('FAIL'):
        return {'error': 'model failed on ' + prompt}
    return {'text': 'echo:' + prompt}


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
                 context_via_pipe=False, max_frame=None, drop_env=()):
        host, guest = socket.socketpair()
        env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
               'RLM_SANDBOX_FD': str(guest.fileno()), 'RLM_SANDBOX_TOKEN': TOKEN}
        if max_frame is not None:
            env['RLM_SANDBOX_MAX_FRAME'] = str(max_frame)
        pass_fds = [guest.fileno()]
        context_fd = None
        if context is not None:
            data = context if isinstance(context, bytes) else context.encode()
            if context_via_pipe:
                context_fd, write_end = os.pipe()
                os.write(write_end, data)
                os.close(write_end)
            else:
                context_fd = os.memfd_create('context')
                os.write(context_fd, data)  # left at its end, as a host leaves it
            env['RLM_SANDBOX_CONTEXT_FD'] = str(context_fd)
            pass_fds.append(context_fd)
        if context_format is not None:
            env['RLM_SANDBOX_CONTEXT_FORMAT'] = context_format
        for name in drop_env:
            env.pop(name, None)
        self.output = tempfile.TemporaryFile(dir=workdir)
        self.stderr = tempfile.TemporaryFile(dir=workdir)
        self.proc = subprocess.Popen(
            [PYTHON, '-I', '-S', '-c', source], env=env, pass_fds=pass_fds, cwd=workdir,
            stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.stderr,
            start_new_session=True)
        guest.close()
        if context_fd is not None:
            os.close(context_fd)
        host.settimeout(IO_TIMEOUT)
        self.first = host          # the first interpreter's channel
        self.checkpoint = None     # the armed checkpoint's channel
        self.standby = host        # where the next execute goes (the first channel until hello)
        self.standby_pid = None
        self.snapshots = set()     # checkpoints the host keeps (commit instead of discard)
        self.sockets = [host]
        self.next_id = 0

    # -- lifecycle

    def hello(self):
        """hello, then the pre-forked standby (fork id 0)."""
        frame, fds = read_frame(self.first)
        self.assert_type(frame, 'hello')
        self.checkpoint = self.first
        self.expect_fork(self.first, 0)
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

    def begin(self, code, output_cap=1 << 20):
        """Sends execute to the standby; returns (op id, checkpoint channel, cell channel)."""
        op_id = self.new_id()
        write_frame(self.standby, {'op': 'execute', 'id': op_id, 'code': code,
                                   'output_cap': output_cap})
        return op_id, self.checkpoint, self.standby

    def serve_cell(self, op_id, child):
        """Answers llm requests until cell_result."""
        while True:
            frame, _ = read_frame(child)
            kind = frame.get('type')
            if kind == 'llm_query':
                write_frame(child, dict(op='llm_result', id=frame['id'],
                                        **answer_for(frame['prompt'])))
            elif kind == 'llm_query_batched':
                write_frame(child, {'op': 'llm_results', 'id': frame['id'],
                                    'items': [answer_for(p) for p in frame['prompts']]})
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

    def execute(self, code, output_cap=1 << 20):
        op_id, parent, child = self.begin(code, output_cap)
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


# --------------------------------------------------------------------------------------------


class StartupTest(WorkerTestCase):
    def test_hello_has_token_pid_version_and_context_length(self):
        worker = self.start(context='h\u00e9llo')
        hello = worker.hello_frame
        self.assertEqual(hello['token'], TOKEN)
        self.assertIsInstance(hello['pid'], int)
        self.assertIn(hello['pid'], descendants(worker.proc.pid))
        self.assertRegex(hello['python'], r'^3\.\d+\.\d+$')
        self.assertEqual(hello['context_length'], 6)  # bytes read
        self.assertEqual(self.stdout_of(worker, 'print(repr(context))'), "'h\u00e9llo'\n")

    def test_text_context_replaces_invalid_utf8(self):
        worker = self.start(context=b'ok\xff')
        self.assertEqual(self.stdout_of(worker, 'context'), "'ok\ufffd'\n")

    def test_json_context(self):
        worker = self.start(context=json.dumps({'a': [1, 2]}), context_format='json')
        self.assertEqual(self.stdout_of(worker, "context['a'][1]"), '2\n')

    def test_context_from_a_pipe(self):
        worker = self.start(context='piped', context_via_pipe=True)
        self.assertEqual(worker.hello_frame['context_length'], 5)
        self.assertEqual(self.stdout_of(worker, 'context'), "'piped'\n")

    def test_no_context_is_none(self):
        worker = self.start()
        self.assertEqual(worker.hello_frame['context_length'], 0)
        self.assertEqual(self.stdout_of(worker, 'print(context)'), 'None\n')

    def test_token_is_gone_from_the_environment(self):
        worker = self.start()
        for pid in (worker.proc.pid, worker.hello_frame['pid']):
            with open('/proc/%d/environ' % pid, 'rb') as f:
                self.assertNotIn(TOKEN.encode(), f.read())
        out = self.stdout_of(worker, (
            "import os, subprocess\n"
            "print('RLM_SANDBOX_TOKEN' in os.environ)\n"
            "print(%r in open('/proc/self/environ', 'rb').read().decode('latin-1'))\n"
            "print(%r in subprocess.run(['env'], capture_output=True, text=True).stdout)\n"
        ) % (TOKEN, TOKEN))
        self.assertEqual(out, 'False\nFalse\nFalse\n')

    def test_missing_token_fails_before_hello(self):
        worker = self.start(hello=False, drop_env=['RLM_SANDBOX_TOKEN'])
        self.assertEqual(worker.wait_exit(), 1)
        self.assertIn('RLM_SANDBOX_TOKEN', worker.stderr_text())
        with self.assertRaises(EOFError):
            read_frame(worker.first)

    def test_invalid_json_context_fails_before_hello(self):
        worker = self.start(hello=False, context='{not json', context_format='json')
        self.assertEqual(worker.wait_exit(), 1)
        self.assertIn('not valid JSON', worker.stderr_text())
        with self.assertRaises(EOFError):
            read_frame(worker.first)


class ProtocolTest(WorkerTestCase):
    def assert_ends_with_error(self, worker, message):
        """The first interpreter (the armed checkpoint after hello) broke off: its exit
        status is the root's, once the standby is gone too."""
        with self.assertRaises(EOFError):
            read_frame(worker.first)
        worker.close(worker.standby)  # EOF: the standby exits 0
        self.assertEqual(worker.wait_exit(), 2)
        self.assertIn('rlm_worker: protocol error: ' + message, worker.stderr_text())

    def test_oversize_frame_ends_the_worker(self):
        worker = self.start(max_frame=4096)
        worker.first.sendall(struct.pack('>I', 4097))
        self.assert_ends_with_error(worker, 'a frame of 4097 bytes exceeds the maximum of 4096')

    def test_non_object_frame_ends_the_worker(self):
        worker = self.start()
        write_frame(worker.first, [1, 2])
        self.assert_ends_with_error(worker, 'a frame from the host is not a JSON object')

    def test_invalid_json_frame_ends_the_worker(self):
        worker = self.start()
        worker.first.sendall(struct.pack('>I', 3) + b'{x]')
        self.assert_ends_with_error(worker, 'a frame from the host is not UTF-8 JSON')

    def test_unexpected_op_for_a_checkpoint_ends_it(self):
        worker = self.start()
        write_frame(worker.first, {'op': 'execute', 'id': 1, 'code': 'pass'})
        self.assert_ends_with_error(worker, "unexpected op 'execute' for a frozen interpreter")

    def test_restore_to_an_armed_checkpoint_is_an_error(self):
        worker = self.start()
        write_frame(worker.first, {'op': 'restore', 'id': 1})
        self.assert_ends_with_error(worker, 'restore sent to an armed checkpoint')

    def test_standby_protocol_error_closes_its_channel(self):
        worker = self.start()
        standby = worker.standby
        write_frame(standby, {'op': 'restore', 'id': 1})
        with self.assertRaises(EOFError):
            read_frame(standby)
        self.assertTrue(wait_until(lambda: "protocol error: unexpected op 'restore' for the "
                                           "standby" in worker.stderr_text()))
        # The checkpoint saw its standby die: it rolls back unprompted, with a new standby.
        frame = worker.expect_rolled_back(worker.first, None)
        self.assertEqual((frame['exit_code'], frame['signal']), (2, None))
        self.assertEqual(self.stdout_of(worker, '1 + 1'), '2\n')

    def test_closing_every_channel_ends_the_worker_cleanly(self):
        worker = self.start()
        self.run_ok(worker, 'x = 1')
        first = worker.hello_frame['pid']
        self.assertTrue(wait_until(lambda: is_gone(first)), 'the discarded checkpoint lives on')
        for sock in worker.sockets:
            sock.close()
        worker.sockets = []
        self.assertEqual(worker.wait_exit(), 0)


class CellTest(WorkerTestCase):
    def test_trailing_expression_is_displayed_and_state_persists(self):
        worker = self.start()
        self.assertEqual(self.stdout_of(worker, 'x = 41\ndef f(v):\n    return v + 1'), '')
        self.assertEqual(self.stdout_of(worker, 'f(x)'), '42\n')
        self.assertEqual(self.stdout_of(worker, 'import math\nNone'), '')
        self.assertEqual(self.stdout_of(worker, 'math.floor(2.5); [x]'), '[41]\n')

    def test_exception_gives_error_status_trimmed_traceback_and_keeps_output(self):
        worker = self.start()
        result = worker.execute("print('before')\ndef g():\n    return 1 / 0\ng()")
        self.assertEqual(result['status'], 'error')
        self.assertEqual(result['stdout'], 'before\n')
        error = result['error']
        self.assertTrue(error.startswith('Traceback (most recent call last):\n'
                                         '  File "<cell>", line 4'), error)
        self.assertIn('return 1 / 0', error)
        self.assertTrue(error.endswith('ZeroDivisionError: division by zero\n'), error)
        self.assertNotIn('<string>', error)
        self.assertEqual(self.stdout_of(worker, "'still alive'"), "'still alive'\n")

    def test_syntax_error_sys_exit_and_keyboard_interrupt_are_errors(self):
        worker = self.start()
        for code, expected in (('x = (', 'SyntaxError'),
                               ('import sys\nsys.exit(3)', 'SystemExit: 3'),
                               ('raise KeyboardInterrupt', 'KeyboardInterrupt')):
            result = worker.execute(code)
            self.assertEqual(result['status'], 'error', code)
            self.assertIn(expected, result['error'])
            self.assertNotIn('<string>', result['error'])

    def test_stdout_stderr_and_subprocess_output_are_captured(self):
        worker = self.start()
        result = self.run_ok(worker, (
            "import os, sys\n"
            "print('one')\n"
            "os.system('echo hi; echo oops >&2')\n"
            "print('two', file=sys.stderr)\n"
            "os.write(1, b'raw\\n')"))
        self.assertEqual(result['stdout'], 'one\nhi\nraw\n4\n')
        self.assertEqual(result['stderr'], 'oops\ntwo\n')
        self.assertFalse(result['stdout_truncated'] or result['stderr_truncated'])
        self.assertIsNone(result['error'])
        self.assertNotIn('final', result)

    def test_output_over_the_cap_is_truncated_to_exactly_the_cap(self):
        worker = self.start()
        cap = 1 << 20
        result = self.run_ok(worker, "print('x' * (10 << 20))", output_cap=cap)
        self.assertEqual(len(result['stdout']), cap)
        self.assertTrue(result['stdout_truncated'])
        self.assertFalse(result['stderr_truncated'])

    def test_background_process_holding_the_pipe_does_not_delay_the_result(self):
        worker = self.start()
        started = time.monotonic()
        result = self.run_ok(worker, "import os\nprint('go')\nos.system('sleep 5 &')")
        self.assertLess(time.monotonic() - started, 3.0)
        self.assertEqual(result['stdout'], 'go\n0\n')

    def test_cpu_ms_counts_the_cells_cpu_time(self):
        worker = self.start()
        result = self.run_ok(worker, (
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3:\n    pass"))
        self.assertGreaterEqual(result['cpu_ms'], 250)
        self.assertLess(self.run_ok(worker, 'pass')['cpu_ms'], 250)

    def test_subprocesses_do_not_inherit_the_channel(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "import subprocess\n"
            "print(subprocess.run('ls -l /proc/self/fd/', shell=True,"
            " capture_output=True, text=True).stdout)"))
        self.assertNotIn('socket:', out)
        self.assertEqual(self.stdout_of(worker, FD_KINDS_CODE), '(1, 0)\n')

    def test_results_and_requests_respect_the_frame_cap(self):
        worker = self.start(max_frame=4096)
        result = self.run_ok(worker, "print('x' * 10000)\nFINAL('done')")
        self.assertTrue(result['stdout_truncated'])
        self.assertTrue(result['stdout'].startswith('xxx'))
        self.assertEqual(result['final'], {'value': 'done'})
        out = self.stdout_of(worker, (
            "try:\n    llm_query('p' * 5000)\n"
            "except ValueError as e:\n    print(e)"))
        self.assertIn('over the channel maximum of 4096', out)

    def test_a_process_forked_by_the_cell_does_not_answer_for_it(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "import os\npid = os.fork()\n"
            "if pid:\n    os.waitpid(pid, 0)\n    print('parent')"))
        self.assertEqual(out, 'parent\n')
        self.assertEqual(self.stdout_of(worker, "'next'"), "'next'\n")

    def test_final_and_final_var(self):
        worker = self.start()
        self.assertEqual(self.run_ok(worker, "FINAL({'a': [1, 2]})")['final'],
                         {'value': {'a': [1, 2]}})
        self.assertEqual(self.run_ok(worker, 'FINAL(1 + 2j)')['final'], {'value': '(1+2j)'})
        self.assertEqual(self.run_ok(worker, 'v = [1]\nFINAL(v)\nv.append(object())')['final'],
                         {'value': [1]})  # the value when FINAL was called
        self.assertEqual(self.run_ok(worker, "answer = 'yes'\nFINAL_VAR('answer')")['final'],
                         {'value': 'yes'})
        missing = worker.execute("FINAL_VAR('nope')")
        self.assertEqual(missing['status'], 'error')
        self.assertIn("NameError: FINAL_VAR: no variable named 'nope'", missing['error'])
        self.assertNotIn('final', missing)

    def test_a_final_value_nested_deeper_than_the_host_takes_is_sent_as_its_repr(self):
        worker = self.start()
        deep = self.run_ok(worker, 'v = 0\nfor _ in range(62): v = [v]\nFINAL(v)')['final']
        self.assertIsInstance(deep['value'], list)  # 62 levels: as it is
        deeper = self.run_ok(worker, 'v = 0\nfor _ in range(63): v = [v]\nFINAL(v)')['final']
        self.assertEqual(deeper['value'], '[' * 63 + '0' + ']' * 63)
        huge = self.run_ok(worker, 'v = 0\nfor _ in range(100000): v = [v]\nFINAL(v)')['final']
        self.assertEqual(huge['value'], '<a list nested too deep to show>')

    def test_a_final_value_with_more_values_than_the_host_takes_is_sent_as_its_repr(self):
        # The host refuses a frame of more than 100,000 JSON values; the result's own fields
        # take a few of them.
        worker = self.start()
        fits = self.run_ok(worker, 'FINAL(list(range(99899)))')['final']
        self.assertIsInstance(fits['value'], list)  # with the list itself: 99,900 values
        over = self.run_ok(worker, 'FINAL(list(range(99900)))')['final']
        self.assertIsInstance(over['value'], str)
        self.assertTrue(over['value'].startswith('[0, 1, 2, '))
        empty = self.run_ok(worker, 'FINAL([{}] * 200000)')['final']
        self.assertIsInstance(empty['value'], str)

    def test_show_vars_lists_only_user_variables(self):
        worker = self.start()
        result = self.run_ok(worker, (
            "import os\nx = 1\n_hidden = 2\ndef f():\n    pass\nnames = SHOW_VARS()\n"
            "print(names)"))
        self.assertEqual(result['stdout'], "x: int\nf: function\n{'x': 'int', 'f': 'function'}\n")
        self.assertEqual(self.stdout_of(worker, 'SHOW_VARS()'),
                         'x: int\nf: function\nnames: VarTable\n')


class RollbackTest(WorkerTestCase):
    def test_os_exit_rolls_back_to_the_state_before_the_cell(self):
        worker = self.start()
        self.run_ok(worker, 'x = 41')
        op_id, parent, child = worker.begin('x = 0\nimport os\nos._exit(3)')
        with self.assertRaises(EOFError):
            read_frame(child)
        frame = worker.expect_rolled_back(parent, None)  # unprompted
        self.assertEqual((frame['exit_code'], frame['signal']), (3, None))
        self.assertEqual(self.stdout_of(worker, 'x'), '41\n')

    def test_host_rollback_crossing_the_standbys_death(self):
        worker = self.start()
        self.run_ok(worker, 'x = 41')
        op_id, parent, child = worker.begin('x = 0\nimport os\nos._exit(3)')
        with self.assertRaises(EOFError):
            read_frame(child)
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        # Either the checkpoint takes the rollback first (frames win), or it has already
        # answered S's death unprompted and then takes the host's rollback as one of the
        # standby it has just forked. The host's answer is the rolled_back with its id.
        frame, _ = read_frame(parent)
        if frame['id'] is None:
            self.assertEqual((frame['type'], frame['exit_code']), ('rolled_back', 3))
            frame, fds = read_frame(parent)
            self.assertEqual((frame['type'], frame['id'], len(fds)), ('fork', None, 1))
            doomed = frame['pid']
            frame, _ = read_frame(parent)
            os.close(fds[0])  # only now: its EOF would let the doomed standby exit 0
            self.assertEqual((frame['exit_code'], frame['signal']), (None, 9))
            self.assertTrue(wait_until(lambda: is_gone(doomed)))
        else:
            self.assertEqual((frame['exit_code'], frame['signal']), (3, None))
        self.assertEqual((frame['type'], frame['id']), ('rolled_back', op_id))
        worker.close(worker.standby)
        worker.expect_fork(parent, op_id)
        # Once rolled back, the same id again is ignored.
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        self.assertEqual(self.stdout_of(worker, 'x'), '41\n')

    def test_killed_and_crashed_cells_roll_back(self):
        worker = self.start()
        self.run_ok(worker, 'x = 41')
        crash = ("import ctypes, resource\n"
                 "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
                 "x = 0\nctypes.string_at(0)")
        for code, sig in (('import os, signal\nx = 0\nos.kill(os.getpid(), 9)', 9),
                          (crash, signal.SIGSEGV)):
            op_id, parent, child = worker.begin(code)
            with self.assertRaises(EOFError):
                read_frame(child)
            frame = worker.expect_rolled_back(parent, None)
            self.assertEqual((frame['exit_code'], frame['signal']), (None, sig))
            self.assertEqual(self.stdout_of(worker, 'x'), '41\n')

    def test_host_rollback_stops_the_cell_and_every_process_it_started(self):
        worker = self.start()
        self.run_ok(worker, 'x = 41')
        pids = os.path.join(self.tmp.name, 'pids')
        op_id, parent, child = worker.begin((
            "import os, subprocess\nx = 0\n"
            "a = subprocess.Popen(['sleep', '60'])\n"
            "b = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "os.system('(setsid sleep 60 &)')\n"
            "with open(%r + '.tmp', 'w') as f:\n"
            "    f.write('%%d %%d' %% (a.pid, b.pid))\n"
            "os.rename(%r + '.tmp', %r)\n"
            "while True:\n    pass") % (pids, pids, pids))
        cell_pid = worker.standby_pid
        self.assertTrue(wait_until(lambda: os.path.exists(pids), IO_TIMEOUT))
        with open(pids) as f:
            started = [int(p) for p in f.read().split()]
        # Not ours, started after the cell: a rollback must leave it alone.
        outsider = subprocess.Popen(['sleep', '60'])
        try:
            before = time.monotonic()
            write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
            frame = worker.expect_rolled_back(parent, op_id)
            self.assertLess(time.monotonic() - before, 0.5)
            self.assertEqual((frame['exit_code'], frame['signal']), (None, 9))
            self.assertTrue(is_gone(cell_pid))
            for pid in started:
                self.assertTrue(wait_until(lambda: is_gone(pid)), 'pid %d survived' % pid)
            self.assertTrue(wait_until(lambda: not [
                pid for pid in descendants(worker.proc.pid)
                if cmdline(pid).startswith('sleep ')]),
                'the setsid sleep survived')
            self.assertIsNone(outsider.poll())
        finally:
            outsider.kill()
            outsider.wait()
        self.assertEqual(self.stdout_of(worker, 'x'), '41\n')

    def test_discarded_checkpoint_exits_and_leaves_the_cell_process(self):
        worker = self.start()
        op_id, parent, child = worker.begin('y = 5')
        checkpoint = worker.hello_frame['pid']
        self.assertEqual(worker.serve_cell(op_id, child)['status'], 'ok')
        worker.close(parent)  # EOF works like discard
        worker.expect_fork(child, op_id)
        self.assertTrue(wait_until(lambda: is_gone(checkpoint)))
        self.assertEqual(self.stdout_of(worker, 'y'), '5\n')

    def test_rollback_of_a_cell_whose_result_crossed_it(self):
        worker = self.start()
        self.run_ok(worker, 'x = 41')
        op_id, parent, child = worker.begin('x = 0')
        cell_pid = worker.standby_pid
        self.assertEqual(worker.serve_cell(op_id, child)['status'], 'ok')
        fork, _ = read_frame(child)  # the standby the cell's process forked
        self.assertEqual(fork['type'], 'fork')
        # The host had timed the cell out: the result is void, the rollback stands.
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        frame, _ = read_frame(parent)
        self.assertEqual((frame['type'], frame['id'], frame['signal']),
                         ('rolled_back', op_id, 9))
        worker.close(child)
        worker.expect_fork(parent, op_id)
        self.assertTrue(wait_until(lambda: is_gone(cell_pid) and is_gone(fork['pid'])))
        self.assertEqual(self.stdout_of(worker, 'x'), '41\n')


class StandbyTest(WorkerTestCase):
    def test_standby_is_forked_unasked_and_runs_the_next_cell(self):
        worker = self.start()
        # After hello: the fork frame (id 0) came without the host sending anything.
        self.assertNotEqual(worker.standby_pid, worker.hello_frame['pid'])
        announced = [worker.standby_pid]
        for i in range(3):
            op_id, parent, child = worker.begin('import os\nos.getpid()')
            result = worker.serve_cell(op_id, child)
            self.assertEqual(result['stdout'], '%d\n' % announced[-1])  # ran in the standby
            # The next fork frame arrives on the cell's channel with nothing sent by the host,
            # not even the old checkpoint's discard.
            worker.expect_fork(child, op_id)
            announced.append(worker.standby_pid)
            worker.release(parent)
        self.assertEqual(len(set(announced)), 4)

    def test_cells_run_in_the_announced_standby_with_the_expected_state(self):
        worker = self.start()
        for i in range(3):
            announced = worker.standby_pid
            out = self.stdout_of(worker, 'import os\nn = %d\nprint(os.getpid(), os.getpgid(0), '
                                         'open("/proc/self/oom_score_adj").read().strip())' % i)
            self.assertEqual(out, '%d %d 1000\n' % (announced, announced))
        self.assertEqual(self.stdout_of(worker, 'n'), '2\n')


class LlmQueryTest(WorkerTestCase):
    def test_answer_and_error(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "print(llm_query('hi', model='small'))\n"
            "try:\n    llm_query('FAIL now')\n"
            "except RuntimeError as e:\n    print('error:', e)"))
        self.assertEqual(out, 'echo:hi\nerror: model failed on FAIL now\n')

    def test_request_fields(self):
        worker = self.start()
        op_id, parent, child = worker.begin("r = llm_query('p', 'm')\nllm_query('q')")
        first, _ = read_frame(child)
        self.assertEqual(first, {'type': 'llm_query', 'id': first['id'], 'prompt': 'p',
                                 'model': 'm'})
        write_frame(child, {'op': 'llm_result', 'id': first['id'], 'text': 'A'})
        second, _ = read_frame(child)
        self.assertEqual(second['model'], None)
        self.assertNotEqual(second['id'], first['id'])
        write_frame(child, {'op': 'llm_result', 'id': second['id'], 'text': 'B'})
        self.assertEqual(worker.serve_cell(op_id, child)['stdout'], "'B'\n")

    def test_argument_types_are_checked(self):
        worker = self.start()
        for call in ('llm_query(3)', "llm_query('p', model=1)", "llm_query_batched('abc')",
                     "llm_query_batched(['a', 2])"):
            result = worker.execute(call)
            self.assertEqual(result['status'], 'error', call)
            self.assertIn('TypeError', result['error'])
        self.assertEqual(self.stdout_of(worker, 'llm_query_batched([])'), '[]\n')
        over = worker.execute("llm_query_batched([''] * 10001)")
        self.assertEqual(over['status'], 'error')
        self.assertIn('ValueError: llm_query_batched takes at most 10000 prompts', over['error'])

    def test_concurrent_queries_from_threads_answered_out_of_order(self):
        worker = self.start()
        op_id, parent, child = worker.begin(
            "import threading\nresults = {}\n"
            "def ask(i):\n    results[i] = llm_query('q%d' % i)\n"
            "threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]\n"
            "for t in threads:\n    t.start()\n"
            "for t in threads:\n    t.join()\n"
            "sorted(results.items())")
        queries = [read_frame(child)[0] for _ in range(4)]
        self.assertEqual(sorted(q['prompt'] for q in queries), ['q0', 'q1', 'q2', 'q3'])
        for query in reversed(queries):
            write_frame(child, {'op': 'llm_result', 'id': query['id'],
                                'text': 'a' + query['prompt'][1:]})
        result = worker.serve_cell(op_id, child)
        self.assertEqual(result['stdout'], "[(0, 'a0'), (1, 'a1'), (2, 'a2'), (3, 'a3')]\n")

    def test_queries_left_behind_by_a_cell_fail_and_steal_no_frames(self):
        worker = self.start()
        op_id, parent, child = worker.begin(
            "import threading, time\nerrors = []\n"
            "def nag():\n    while True:\n"
            "        try:\n            llm_query('late')\n"
            "        except RuntimeError as e:\n            errors.append(str(e))\n"
            "        time.sleep(0.01)\n"
            "threading.Thread(target=nag, daemon=True).start()\n"
            "time.sleep(0.2)")
        frames = [read_frame(child)[0] for _ in range(2)]  # the query, then the result
        self.assertEqual([f['type'] for f in frames], ['llm_query', 'cell_result'])
        worker.finish(op_id, parent, child)
        # Too late: the cell is over and the answer is dropped.
        write_frame(child, {'op': 'llm_result', 'id': frames[0]['id'], 'text': 'late'})
        # The thread lives on in this process, which is now the checkpoint: it keeps failing
        # its queries and must not steal the rollback from the checkpoint's main thread.
        time.sleep(0.1)
        op_id, parent, child = worker.begin('while True:\n    pass')
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        self.assertEqual(worker.expect_rolled_back(parent, op_id)['signal'], 9)
        out = self.stdout_of(worker, "print(errors[0])\nprint(set(errors[1:]))")
        self.assertEqual(out, "the cell ended before the answer to llm_query arrived\n"
                              "{'llm_query can only be called while a cell is running'}\n")

    def test_batched_with_one_failing_item(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "prompts = ['p%d' % i for i in range(20)]\nprompts[7] = 'FAIL 7'\n"
            "r = llm_query_batched(prompts)\n"
            "print(len(r), sum(isinstance(x, str) for x in r))\n"
            "print(type(r[7]).__name__, r[7])\nprint(r[0], r[19])"))
        self.assertEqual(out, '20 19\nRuntimeError model failed on FAIL 7\necho:p0 echo:p19\n')


class SnapshotTest(WorkerTestCase):
    def test_restore_twice_from_one_snapshot(self):
        worker = self.start()
        self.run_ok(worker, 'x = 1')
        snapshot = worker.snapshot()
        for value in (2, 3):
            self.run_ok(worker, 'x = %d' % value)  # commits the snapshot on the first pass
            self.assertEqual(self.stdout_of(worker, 'x'), '%d\n' % value)
            worker.restore(snapshot)
            self.assertIs(worker.checkpoint, snapshot)
            self.assertEqual(self.stdout_of(worker, 'x'), '1\n')
            self.assertEqual(self.stdout_of(worker, FD_KINDS_CODE), '(1, 0)\n')

    def test_restore_right_after_the_snapshot_and_after_further_cells(self):
        worker = self.start()
        self.run_ok(worker, 'x = 1')
        snapshot = worker.snapshot()
        worker.restore(snapshot)  # the snapshot is the current checkpoint: commit, restore
        self.assertEqual(self.stdout_of(worker, 'x'), '1\n')
        self.run_ok(worker, 'x = 2\ny = 3')
        self.run_ok(worker, 'x += 10')
        later = worker.snapshot()
        self.run_ok(worker, 'x = 0')
        worker.restore(snapshot)
        self.assertEqual(self.stdout_of(worker, "x, 'y' in globals()"), '(1, False)\n')
        worker.restore(later)
        self.assertEqual(self.stdout_of(worker, 'x, y'), '(12, 3)\n')
        # A rollback inside a restored branch goes back to the snapshot's state.
        op_id, parent, child = worker.begin('x = 99\nimport os\nos._exit(1)')
        with self.assertRaises(EOFError):
            read_frame(child)
        worker.expect_rolled_back(parent, None)
        self.assertEqual(self.stdout_of(worker, 'x'), '12\n')

    def test_committed_snapshot_lets_its_former_child_live_and_die_silently(self):
        worker = self.start()
        self.run_ok(worker, 'x = 1')
        snapshot = worker.snapshot()
        former_child = worker.standby_pid  # the snapshot's standby runs the next cell
        self.run_ok(worker, 'x = 2')  # then forks its own standby; the snapshot is committed
        # The former child goes on as the checkpoint: a crash of its standby is reported by
        # it, not by the snapshot.
        op_id, parent, child = worker.begin('import os\nos._exit(5)')
        self.assertIsNot(parent, snapshot)
        with self.assertRaises(EOFError):
            read_frame(child)
        self.assertEqual(worker.expect_rolled_back(parent, None)['exit_code'], 5)
        worker.snapshot()  # so the next cell commits it and it stays
        self.assertEqual(self.stdout_of(worker, "x += 1\nx"), '3\n')
        self.assertFalse(is_gone(former_child))
        os.kill(former_child, signal.SIGKILL)
        self.assertTrue(wait_until(lambda: proc_stat(former_child) is None),
                        'the snapshot did not reap its former child')
        # The snapshot said nothing about it, and a late rollback to it is ignored.
        snapshot.settimeout(0.2)
        with self.assertRaises(socket.timeout):
            read_frame(snapshot)
        snapshot.settimeout(IO_TIMEOUT)
        write_frame(snapshot, {'op': 'rollback', 'id': 999, 'reason': 'timeout'})
        write_frame(snapshot, {'op': 'commit'})  # and so is a second commit
        worker.discard(worker.checkpoint)
        worker.discard(worker.standby)
        restore_id = worker.new_id()
        write_frame(snapshot, {'op': 'restore', 'id': restore_id})
        worker.expect_fork(snapshot, restore_id)
        self.assertEqual(self.stdout_of(worker, 'x'), '1\n')


# The fallbacks, by running the same tests on a Python without os.pidfd_open / ctypes.

class NoPidfdRollbackTest(RollbackTest):
    source = 'import os\ndel os.pidfd_open\n' + SOURCE


class NoCtypesTest(WorkerTestCase):
    source = "import sys\nsys.modules['ctypes'] = None\n" + SOURCE

    def test_refuses_to_start_when_it_cannot_protect_its_checkpoints(self):
        # Without ctypes there is no prctl(PR_SET_DUMPABLE): a cell could write into its
        # checkpoint through /proc/PID/mem. No session rather than one that cannot roll back.
        worker = self.start(hello=False)
        self.assertEqual(worker.wait_exit(), 1)
        self.assertIn('cannot make the interpreter non-dumpable', worker.stderr_text())


class DumpableTest(WorkerTestCase):
    GET = ("import ctypes\n"
           "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")  # PR_GET_DUMPABLE

    def test_every_interpreter_is_non_dumpable_even_after_a_cell_undid_it(self):
        worker = self.start()
        self.assertEqual(self.stdout_of(worker, self.GET), '0\n')
        self.assertEqual(self.stdout_of(worker, "import ctypes\n"
                                                "print(ctypes.CDLL(None).prctl(4, 1, 0, 0, 0))\n"
                                                + self.GET), '0\n1\n')
        # The cell after it runs in a child of the process that cell made dumpable.
        self.assertEqual(self.stdout_of(worker, self.GET), '0\n')


if __name__ == '__main__':
    unittest.main()
