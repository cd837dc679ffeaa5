"""Rollback to the checkpoint, the standby forked between cells, and what keeps a cell out of
its checkpoint (non-dumpable interpreters)."""

import os
import signal
import subprocess
import time
import unittest

from worker_host import (IO_TIMEOUT, SOURCE, WorkerTestCase, cmdline, descendants, is_gone,
                         read_frame, wait_until, write_frame)


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
        # After the hand-over: the fork frame (id 0) came without the host sending more.
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
