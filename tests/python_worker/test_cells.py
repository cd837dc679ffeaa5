"""A cell: its output, errors, CPU time, frame cap, FINAL, SHOW_VARS."""

import os
import time
import unittest

from worker_host import FD_KINDS_CODE, WorkerTestCase


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

    def test_cells_back_to_back_leave_no_fds_or_threads_behind(self):
        # Each cell's output capture ends its drain thread without waiting for it; its pipes
        # are closed before the next fork, so no generation inherits them.
        worker = self.start()
        count = "import os\nprint(len(os.listdir('/proc/self/fd')), len(os.listdir('/proc/self/task')))"
        first = self.stdout_of(worker, count)
        for _ in range(40):
            self.run_ok(worker, 'pass')
        self.assertEqual(self.stdout_of(worker, count), first)
        # A standby that ran add_context made a capture no cell used: retired at its fork.
        for i in range(10):
            worker.add_context('more', index=i + 1)
        self.assertEqual(self.stdout_of(worker, count), first)

    def test_a_byte_in_a_capture_pipe_leaves_no_thread_spinning_in_a_checkpoint(self):
        # A standby that ran add_context becomes a checkpoint holding a capture no cell used;
        # its drain thread must be ended and its pipes closed at the fork, or a later cell
        # writing into every pipe it can see would leave the thread spinning in the checkpoint.
        worker = self.start()
        worker.add_context('more', index=1)
        poke_and_watch = (
            "import os, stat, time\n"
            "for fd in map(int, os.listdir('/proc/self/fd')):\n"
            "    try:\n"
            "        if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
            "            os.write(fd, b'x')\n"
            "    except OSError:\n"
            "        pass\n"
            "def ticks():\n"
            "    with open('/proc/%d/stat' % os.getppid()) as f:\n"
            "        fields = f.read().rsplit(')', 1)[1].split()\n"
            "    return int(fields[11]) + int(fields[12])\n"
            "time.sleep(0.2)\n"
            "start = ticks()\n"
            "time.sleep(1)\n"
            "print(ticks() - start)")
        spent = int(self.stdout_of(worker, poke_and_watch))
        hz = os.sysconf('SC_CLK_TCK')
        self.assertLess(spent, hz // 4, 'the checkpoint used %d of %d ticks' % (spent, hz))

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

    def test_show_vars_returns_the_text_of_localrepl(self):
        # LocalREPL's _show_vars: every variable but _-names and answer (modules too), as
        # "Available variables: {...}"; the functions are not variables.
        worker = self.start()
        self.assertEqual(self.stdout_of(worker, 'print(SHOW_VARS())'),
                         'No variables created yet. Use ```repl``` blocks to create '
                         'variables.\n')
        result = self.run_ok(worker, (
            "import os\nx = 1\n_hidden = 2\ndef f():\n    pass\nnames = SHOW_VARS()\n"
            "print(names)"))
        self.assertEqual(result['stdout'],
                         "Available variables: {'os': 'module', 'x': 'int', 'f': 'function'}\n")
        # As a cell's last expression it shows as its text, once; print() shows it once too.
        self.assertEqual(self.stdout_of(worker, 'SHOW_VARS()'),
                         "Available variables: {'os': 'module', 'x': 'int', 'f': 'function', "
                         "'names': 'str'}\n")


if __name__ == '__main__':
    unittest.main()
