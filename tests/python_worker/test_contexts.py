"""add_context: a context or a history entry added to a live session as context_N / history_N,
its bytes an fd attached to the frame, answered like a cell (and kept by later rollbacks)."""

import json
import os
import unittest

from worker_host import WorkerTestCase, read_frame, wait_until, write_frame


class AddContextTest(WorkerTestCase):
    def test_contexts_are_numbered_from_the_handovers(self):
        worker = self.start(context='first')
        added = worker.add_context('second')
        self.assertEqual((added['status'], added['index'], added['stdout']), ('ok', 1, ''))
        self.assertEqual(worker.add_context(json.dumps({'k': [1]}), data_format='json')['index'],
                         2)
        self.assertEqual(worker.add_context('at five', index=5)['index'], 5)
        self.assertEqual(worker.add_context('next free')['index'], 6)
        out = self.stdout_of(worker, 'print(context, context_0, context_1, context_2, context_5, '
                                     'context_6)')
        self.assertEqual(out, "first first second {'k': [1]} at five next free\n")

    def test_without_a_handover_context_the_first_added_is_context(self):
        worker = self.start()
        self.assertEqual(worker.add_context('only')['index'], 0)
        self.assertEqual(self.stdout_of(worker, 'print(context, context_0)'), 'only only\n')
        self.assertEqual(worker.add_context('replaced', index=0)['index'], 0)
        self.assertEqual(self.stdout_of(worker, 'print(context)'), 'replaced\n')

    def test_histories(self):
        worker = self.start()
        turn = [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a'}]
        for expected in (0, 1):
            result = worker.add_context(json.dumps(turn), kind='history', data_format='json')
            self.assertEqual(result['index'], expected)
        out = self.stdout_of(worker, "print(history == history_0 == history_1 == %r)\n"
                                     "print('context' in globals())" % turn)
        self.assertEqual(out, 'True\nFalse\n')

    def test_invalid_json_is_a_cell_error_that_changes_nothing(self):
        worker = self.start()
        result = worker.add_context('{no', data_format='json')
        self.assertEqual(result['status'], 'error')
        self.assertNotIn('index', result)
        self.assertIn('the context is not valid JSON', result['error'])
        bad_history = worker.add_context('[', kind='history', data_format='json')
        self.assertIn('the history is not valid JSON', bad_history['error'])
        self.assertEqual(worker.add_context('good')['index'], 0)

    def test_a_large_context_crosses_as_its_fd_and_text_is_decoded_with_replacement(self):
        worker = self.start(max_frame=4096)
        data = b'x' * (8 << 20) + b'\xff'
        self.assertEqual(worker.add_context(data)['index'], 0)
        self.assertEqual(self.stdout_of(worker, 'print(len(context), context[-1])'),
                         '%d \ufffd\n' % (len(data)))

    def test_a_rollback_after_add_context_keeps_it(self):
        # The standby that ran add_context became the checkpoint: what it added is the state.
        worker = self.start(context='c0')
        worker.add_context('c1')
        op_id, parent, child = worker.begin('context_1 = None\nwhile True:\n    pass')
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        worker.expect_rolled_back(parent, op_id)
        self.assertEqual(self.stdout_of(worker, 'print(context, context_1)'), 'c0 c1\n')

    def test_add_context_as_the_first_op_then_a_crash(self):
        worker = self.start(context='c0')
        worker.add_context('c1')
        op_id, parent, child = worker.begin('import os\nos._exit(1)')
        worker.expect_rolled_back(parent, None)
        self.assertEqual(self.stdout_of(worker, 'print(context_0, context_1)'), 'c0 c1\n')

    def test_a_snapshot_restores_the_contexts_it_had(self):
        worker = self.start()
        worker.add_context('before')
        snapshot = worker.snapshot()
        worker.add_context('after')
        worker.restore(snapshot)
        out = self.stdout_of(worker, "print(context_0, 'context_1' in globals())")
        self.assertEqual(out, 'before False\n')
        self.assertEqual(worker.add_context('again')['index'], 1)

    def test_add_context_without_its_fd_is_a_protocol_error(self):
        worker = self.start()
        write_frame(worker.standby, {'op': 'add_context', 'id': 9, 'index': None,
                                     'kind': 'context', 'format': 'text'})
        with self.assertRaises(EOFError):
            read_frame(worker.standby)
        self.assertTrue(wait_until(lambda: 'protocol error: add_context without its fd'
                                   in worker.stderr_text()), worker.stderr_text())

    def test_malformed_add_context_fields_are_protocol_errors(self):
        for fields, message in (({'index': -1}, 'index must be a non-negative integer'),
                                ({'index': True}, 'index must be a non-negative integer'),
                                ({'kind': 'other'}, 'needs a kind'),
                                ({'format': 'xml'}, 'needs a kind')):
            worker = self.start()
            op = {'op': 'add_context', 'id': 9, 'index': None, 'kind': 'context',
                  'format': 'text'}
            op.update(fields)
            fd = os.memfd_create('x')
            write_frame(worker.standby, op, fd)
            os.close(fd)
            with self.assertRaises(EOFError):
                read_frame(worker.standby)
            self.assertTrue(wait_until(lambda: message in worker.stderr_text()),
                            worker.stderr_text())

    def test_add_context_before_the_handover_is_a_protocol_error(self):
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        fd = os.memfd_create('x')
        write_frame(worker.standby, {'op': 'add_context', 'id': 1, 'index': None,
                                     'kind': 'context', 'format': 'text'}, fd)
        os.close(fd)
        with self.assertRaises(EOFError):
            read_frame(worker.standby)
        self.assertTrue(wait_until(lambda: 'protocol error: add_context before the handover'
                                   in worker.stderr_text()), worker.stderr_text())

    def test_an_fd_sent_with_any_other_frame_is_closed_and_never_reaches_a_cell(self):
        worker = self.start()
        fd = os.memfd_create('stray-fd')
        op_id = worker.new_id()
        parent, child = worker.checkpoint, worker.standby
        write_frame(child, {'op': 'execute', 'id': op_id, 'code': (
            "import os\nlinks = []\nfor n in os.listdir('/proc/self/fd'):\n"
            "    try:\n        links.append(os.readlink('/proc/self/fd/' + n))\n"
            "    except OSError:\n        pass\n"
            "print(any('stray-fd' in l for l in links))"), 'output_cap': 4096}, fd)
        os.close(fd)
        result = worker.serve_cell(op_id, child)
        worker.finish(op_id, parent, child)
        self.assertEqual(result['stdout'], 'False\n')


if __name__ == '__main__':
    unittest.main()
