"""The reserved names (the worker's functions, the tools, context/context_N, history/history_N,
answer) are restored after every cell, as the RLM library's LocalREPL does: a cell that rebinds
or deletes one does not break the next."""

import json
import unittest

from worker_host import WorkerTestCase

REBIND_ALL = (
    "llm_query = None\nllm_query_batched = 1\nrlm_query = 2\nrlm_query_batched = 3\n"
    "FINAL = 4\nFINAL_VAR = 5\nSHOW_VARS = 6\ncontext = 7\ncontext_0 = 8\nlookup = 9\n"
    "table = 10\nanswer = 11\n")
CHECK_ALL = (
    "print(llm_query('a'), llm_query_batched(['b']), rlm_query('c'), rlm_query_batched(['d']))\n"
    "print(callable(FINAL), callable(FINAL_VAR), SHOW_VARS()[:9])\n"
    "print(context, context_0, lookup(1)['tool'], table, answer)")
EXPECTED = ("echo:a ['echo:b'] rlm:c ['rlm:d']\nTrue True Available\n"
            "ctx ctx lookup [1, 2] {'content': '', 'ready': False}\n")
TOOLS = [{'name': 'lookup'}, {'name': 'table', 'value': [1, 2]}]


class ReservedNamesTest(WorkerTestCase):
    def test_every_reserved_name_a_cell_rebinds_is_restored(self):
        worker = self.start(context='ctx')
        self.run_ok(worker, REBIND_ALL)
        self.assertEqual(self.stdout_of(worker, CHECK_ALL), EXPECTED)

    def test_restored_after_a_cell_that_raises(self):
        worker = self.start(context='ctx')
        self.assertEqual(worker.execute(REBIND_ALL + '1 / 0')['status'], 'error')
        self.assertEqual(self.stdout_of(worker, CHECK_ALL), EXPECTED)

    def test_restored_after_a_cell_that_deletes_them(self):
        worker = self.start(context='ctx')
        names = ['llm_query', 'llm_query_batched', 'rlm_query', 'rlm_query_batched', 'FINAL',
                 'FINAL_VAR', 'SHOW_VARS', 'context', 'context_0', 'lookup', 'table', 'answer']
        self.run_ok(worker, ''.join('del %s\n' % name for name in names))
        self.assertEqual(self.stdout_of(worker, CHECK_ALL), EXPECTED)

    def test_within_a_cell_a_rebinding_holds(self):
        worker = self.start()
        out = self.stdout_of(worker, "llm_query = lambda p: 'mine'\nprint(llm_query('x'))")
        self.assertEqual(out, 'mine\n')
        self.assertEqual(self.stdout_of(worker, "print(llm_query('x'))"), 'echo:x\n')

    def test_without_a_context_context_is_unbound_and_stays_the_cells(self):
        # LocalREPL: no context_0, no `context` (a NameError), and it restores `context` only
        # from context_0, so a cell's own binding holds until there is one.
        worker = self.start()
        result = worker.execute('print(context)')
        self.assertEqual(result['status'], 'error')
        self.assertIn("NameError: name 'context' is not defined", result['error'])
        self.run_ok(worker, 'context = 1')
        self.assertEqual(self.stdout_of(worker, 'print(context)'), '1\n')

    def test_history_stays_the_cells_until_there_is_a_history_0(self):
        # LocalREPL restores history only from history_0.
        worker = self.start()
        self.run_ok(worker, 'history = 1')
        self.assertEqual(self.stdout_of(worker, 'print(history)'), '1\n')
        worker.add_context(json.dumps([{'role': 'user', 'content': 'hi'}]), kind='history',
                           data_format='json')
        self.run_ok(worker, 'history = 2\nhistory_0 = 3')
        self.assertEqual(self.stdout_of(worker, 'print(history, history_0)'),
                         "[{'role': 'user', 'content': 'hi'}] [{'role': 'user', 'content': "
                         "'hi'}]\n")

    def start(self, **kwargs):
        worker = super().start(hello=False, **kwargs)
        worker.hello(hand_over=False)
        reply = worker.hand_over(options={'tools': TOOLS})
        self.assertNotIn('error', reply)
        return worker


if __name__ == '__main__':
    unittest.main()
