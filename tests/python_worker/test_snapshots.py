"""Snapshots: commit, restore, and a committed snapshot's former children."""

import os
import signal
import socket
import unittest

from worker_host import (FD_KINDS_CODE, IO_TIMEOUT, WorkerTestCase, is_gone, proc_stat, read_frame,
                         wait_until, write_frame)


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


if __name__ == '__main__':
    unittest.main()
