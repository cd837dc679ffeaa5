"""execute's `locals` (the cells' variables with types and short reprs, what the RLM library's
REPLResult.locals needs) and `fetch` (one variable, as JSON when it is)."""

import unittest

from worker_host import WorkerTestCase


class LocalsTest(WorkerTestCase):
    def test_locals_lists_the_cells_variables_only(self):
        worker = self.start(context='ctx')
        result = self.run_ok(worker, (
            "import os\nx = 1\n_hidden = 2\ns = 'a' * 500\n"
            "class Bad:\n    def __repr__(self):\n        raise ValueError('no')\n"
            "bad = Bad()\nllm_query = 3\nanswer['content'] = 'c'"), locals=True)
        listed = {entry['name']: entry for entry in result['locals']}
        self.assertEqual(sorted(listed), ['Bad', 'bad', 's', 'x'])
        self.assertEqual(listed['x'], {'name': 'x', 'type': 'int', 'repr': '1', 'value': 1})
        self.assertEqual(listed['s']['repr'], "'" + 'a' * 199)
        self.assertEqual(listed['bad'], {'name': 'bad', 'type': 'Bad',
                                         'repr': '<unrepresentable>'})
        self.assertNotIn('locals', self.run_ok(worker, 'y = 2'))

    def test_at_most_a_thousand_are_listed(self):
        worker = self.start()
        result = self.run_ok(worker, 'for i in range(1500):\n    globals()["v%d" % i] = i',
                             locals=True)
        self.assertEqual(len(result['locals']), 1000)
        self.assertEqual(result['locals'][0],
                         {'name': 'i', 'type': 'int', 'repr': '1499', 'value': 1499})

    def test_small_json_values_come_with_their_repr(self):
        # LocalREPL's REPLResult.locals holds the values (the RLM library logs them): a small
        # JSON one comes as itself, tuples as lists; large ones and objects only as a repr.
        worker = self.start()
        listed = {entry['name']: entry for entry in self.run_ok(worker, (
            "t = (1, [2, 'x'], {'k': None})\nlong = list(range(300))\n"
            "text = 'y' * 5000\nkeys = {1: 2}\nnan = float('nan')\nc = 1j"),
            locals=True)['locals']}
        self.assertEqual(listed['t']['value'], [1, [2, 'x'], {'k': None}])
        for name in ('long', 'text', 'keys', 'nan', 'c'):
            self.assertNotIn('value', listed[name], name)
            self.assertTrue(listed[name]['repr'], name)

    def test_the_listed_values_together_stay_bounded(self):
        # 1000 variables of 250 values each would be 250,000 values: past the host's bound of a
        # frame. Values stop at about 20,000; the names and reprs are all listed.
        worker = self.start()
        result = self.run_ok(worker, 'for i in range(1000):\n'
                                     '    globals()["v%d" % i] = list(range(249))', locals=True)
        self.assertEqual(len(result['locals']), 1000)
        with_value = sum('value' in entry for entry in result['locals'])
        self.assertGreater(with_value, 10)
        self.assertLess(with_value * 250, 21000)

    def test_locals_that_do_not_fit_a_frame_are_cut(self):
        worker = self.start(max_frame=16 * 1024)
        result = self.run_ok(worker, 'for i in range(900):\n    globals()["v%d" % i] = "x" * 300',
                             locals=True)
        self.assertLess(len(result['locals']), 900)
        self.assertGreater(len(result['locals']), 10)


class FetchTest(WorkerTestCase):
    def test_fetch_returns_json_or_the_repr_or_an_error(self):
        worker = self.start()
        self.run_ok(worker, "d = {'a': [1, 2.5, None]}\nc = 1 + 2j")
        self.assertEqual(self.run_ok(worker, '', fetch='d')['fetched'],
                         {'value': {'a': [1, 2.5, None]}})
        self.assertEqual(self.run_ok(worker, '', fetch='c')['fetched'], {'value': '(1+2j)'})
        self.assertEqual(self.run_ok(worker, '', fetch='nope')['fetched'],
                         {'error': "no variable named 'nope'"})

    def test_fetch_is_taken_after_the_code_ran(self):
        worker = self.start()
        self.assertEqual(self.run_ok(worker, 'n = 41\nn += 1', fetch='n')['fetched'],
                         {'value': 42})

    def test_a_fetched_value_too_large_for_the_frame_becomes_an_error(self):
        worker = self.start(max_frame=64 * 1024)
        result = self.run_ok(worker, "big = 'b' * 100000\nprint('out')", fetch='big')
        self.assertEqual(result['fetched'],
                         {'error': 'the value is too large for the control channel'})

    def test_fetched_and_final_together_stay_within_the_hosts_value_bound(self):
        worker = self.start()
        result = self.run_ok(worker, 'v = list(range(60000))\nFINAL(v)', fetch='v')
        self.assertIsInstance(result['final']['value'], list)
        self.assertIsInstance(result['fetched']['value'], str)  # the rest of the budget: repr

    def test_a_repr_that_raises_is_an_error(self):
        worker = self.start()
        self.run_ok(worker, "class B:\n    def __repr__(self):\n        raise KeyError(1)\nb = B()")
        self.assertEqual(self.run_ok(worker, '', fetch='b')['fetched'],
                         {'error': "the value of 'b' cannot be shown (its repr() raised "
                                   "KeyError)"})


if __name__ == '__main__':
    unittest.main()
