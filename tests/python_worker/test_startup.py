"""The worker starts, says hello with its context, and ends on a broken protocol."""

import json
import struct
import unittest

from worker_host import (TOKEN, WorkerTestCase, descendants, is_gone, read_frame, wait_until,
                         write_frame)


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


if __name__ == '__main__':
    unittest.main()
