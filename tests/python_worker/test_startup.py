"""The worker starts, says hello, waits for its hand-over (the caller's context), and ends on
a broken protocol."""

import json
import os
import select
import struct
import unittest

from worker_host import (TOKEN, WorkerTestCase, descendants, is_gone, read_frame, wait_until,
                         write_frame)


class StartupTest(WorkerTestCase):
    def test_hello_has_token_pid_and_version_and_the_context_comes_with_the_handover(self):
        worker = self.start(context='h\u00e9llo')
        hello = worker.hello_frame
        self.assertEqual(hello['token'], TOKEN)
        self.assertIsInstance(hello['pid'], int)
        self.assertIn(hello['pid'], descendants(worker.proc.pid))
        self.assertRegex(hello['python'], r'^3\.\d+\.\d+$')
        self.assertEqual(self.stdout_of(worker, 'print(repr(context))'), "'h\u00e9llo'\n")

    def test_text_context_replaces_invalid_utf8(self):
        worker = self.start(context=b'ok\xff')
        self.assertEqual(self.stdout_of(worker, 'context'), "'ok\ufffd'\n")

    def test_json_context(self):
        worker = self.start(context=json.dumps({'a': [1, 2]}), context_format='json')
        self.assertEqual(self.stdout_of(worker, "context['a'][1]"), '2\n')

    def test_context_from_a_pipe(self):
        worker = self.start(context='piped', context_via_pipe=True)
        self.assertEqual(self.stdout_of(worker, 'context'), "'piped'\n")

    def test_a_large_context_crosses_as_its_fd_not_in_a_frame(self):
        data = 'x' * (3 << 20) + 'needle'  # over the frame maximum below
        worker = self.start(context=data, max_frame=1 << 20)
        self.assertEqual(self.stdout_of(worker, "print(len(context), context.find('needle'))"),
                         '%d %d\n' % (len(data), len(data) - 6))

    def test_no_context_leaves_context_unbound(self):
        worker = self.start()
        self.assertEqual(self.stdout_of(worker, "print('context' in globals())"), 'False\n')

    def test_a_started_worker_waits_for_its_handover_with_its_first_standby(self):
        # The warm state: hello said, the first checkpoint and its standby forked, nothing more
        # sent on either channel.
        worker = self.start(hello=False, context='later')
        hello = worker.hello(hand_over=False)
        readable, _, _ = select.select([worker.first, worker.standby], [], [], 0.5)
        self.assertEqual(readable, [])
        self.assertEqual(sorted(descendants(worker.proc.pid)),
                         sorted([hello['pid'], worker.standby_pid]))
        self.assertEqual(worker.hand_over(), {'type': 'handed_over', 'id': 0})
        self.assertEqual(self.stdout_of(worker, 'context'), "'later'\n")

    def test_the_first_checkpoint_gives_a_rolled_back_first_cell_the_context(self):
        # The checkpoint applies the hand-over only when it forks again: after a rollback of
        # the first cell the new standby has the caller's context.
        worker = self.start(context='kept')
        op_id, parent, child = worker.begin('import os\nos._exit(3)')
        worker.expect_rolled_back(parent, None)
        self.assertEqual(self.stdout_of(worker, 'context'), "'kept'\n")

    def test_a_snapshot_taken_before_the_first_cell_restores_the_context(self):
        worker = self.start(context='snap')
        snapshot = worker.snapshot()
        self.run_ok(worker, 'context = None')
        worker.restore(snapshot)
        self.assertEqual(self.stdout_of(worker, 'context'), "'snap'\n")

    def test_the_handover_sets_the_frame_maximum(self):
        # Started with the default maximum; the caller's smaller one holds after the hand-over.
        worker = self.start(hello=False)
        worker.max_frame = 4096
        worker.hello()
        result = self.run_ok(worker, "print('y' * 10000)")
        self.assertTrue(result['stdout_truncated'])
        self.assertLess(len(result['stdout']), 4096)

    def test_nothing_of_the_start_is_on_a_cells_stack(self):
        # The token is for the hello alone: no frame below the cell (main, the first
        # interpreter) keeps it, nor the Config they hold.
        worker = self.start()
        scan = '''
import sys
def _scan(reversed_token):
    f, seen = sys._getframe(1), []
    while f is not None:
        for v in list(f.f_locals.values()):
            seen.append(repr(v))
            seen.append(repr(getattr(v, '__dict__', None)))
        f = f.f_back
    return len(seen) > 0, any(reversed_token[::-1] in s for s in seen)
print(*_scan(%r))
'''
        out = self.stdout_of(worker, scan % TOKEN[::-1])  # the cell's code must not hold it
        self.assertEqual(out, 'True False\n')

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

    def test_site_dirs_are_importable_and_their_pth_files_processed(self):
        # RLM_SANDBOX_SITE_DIRS: the Python environment the policy exposes (a venv's
        # site-packages); the worker runs -I -S, so only these reach sys.path.
        first, second = (os.path.join(self.tmp.name, name) for name in ('site1', 'site2'))
        for path in (first, second, os.path.join(second, 'extra')):
            os.mkdir(path)
        with open(os.path.join(first, 'venvmod.py'), 'w') as f:
            f.write('VALUE = 41\n')
        with open(os.path.join(second, 'extra', 'pthmod.py'), 'w') as f:
            f.write('VALUE = 1\n')
        with open(os.path.join(second, 'x.pth'), 'w') as f:
            f.write('extra\n')
        worker = self.start(extra_env={'RLM_SANDBOX_SITE_DIRS': first + ':' + second})
        out = self.stdout_of(worker, (
            "import os, venvmod, pthmod\nprint(venvmod.VALUE + pthmod.VALUE)\n"
            "print([k for k in os.environ if k.startswith('RLM_SANDBOX')])"))
        self.assertEqual(out, '42\n[]\n')

    def test_a_relative_site_dir_fails_before_hello(self):
        worker = self.start(hello=False, extra_env={'RLM_SANDBOX_SITE_DIRS': '/ok:relative'})
        self.assertEqual(worker.wait_exit(), 1)
        self.assertIn("RLM_SANDBOX_SITE_DIRS holds 'relative', not an absolute path",
                      worker.stderr_text())

    def test_without_site_dirs_only_the_standard_library_imports(self):
        worker = self.start()
        self.assertEqual(self.stdout_of(worker, (
            "import sys\nprint(any(p.endswith('-packages') for p in sys.path))")), 'False\n')

    def test_invalid_json_context_fails_the_handover(self):
        worker = self.start(hello=False, context='{not json', context_format='json')
        worker.hello(hand_over=False)
        reply = worker.hand_over()
        self.assertIn('the context is not valid JSON', reply['error'])


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

    def assert_standby_refuses(self, worker, frame, message):
        """The standby ends with a protocol error on `frame`."""
        write_frame(worker.standby, frame)
        with self.assertRaises(EOFError):
            read_frame(worker.standby)
        self.assertTrue(wait_until(lambda: 'protocol error: ' + message in worker.stderr_text()),
                        worker.stderr_text())

    def test_execute_before_the_handover_is_a_protocol_error(self):
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        self.assert_standby_refuses(worker, {'op': 'execute', 'id': 1, 'code': 'pass'},
                                    'execute before the handover')

    def test_a_handover_announcing_a_context_without_its_fd_is_a_protocol_error(self):
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        self.assert_standby_refuses(
            worker, {'op': 'handover', 'id': 0, 'max_frame': 4096, 'context': 'text'},
            'handover with a context and no fd')

    def test_a_second_handover_is_a_protocol_error(self):
        worker = self.start()
        self.assert_standby_refuses(
            worker, {'op': 'handover', 'id': 1, 'max_frame': 4096, 'context': None},
            'a second handover')

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


if __name__ == '__main__':
    unittest.main()
