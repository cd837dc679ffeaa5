"""llm_query and llm_query_batched over the channel."""

import time
import unittest

from worker_host import WorkerTestCase, read_frame, write_frame


class LlmQueryTest(WorkerTestCase):
    def test_answer_and_error(self):
        # A failed call returns the library's "Error: ..." text (LocalREPL), it does not raise.
        worker = self.start()
        out = self.stdout_of(worker, (
            "print(llm_query('hi', model='small'))\n"
            "print(llm_query('FAIL now'))"))
        self.assertEqual(out, 'echo:hi\nError: model failed on FAIL now\n')

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

    def test_a_call_that_cannot_be_made_answers_error_text_as_localrepl(self):
        # LocalREPL hands any prompt to its LM handler, which answers "Error: ..." for one it
        # cannot take: the cell gets text, not an exception, and nothing reaches the host.
        worker = self.start()
        self.assertEqual(
            self.stdout_of(worker, "print(llm_query(3))\nprint(rlm_query(b'x'))\n"
                                   "print(llm_query('p', model=1))"),
            'Error: prompt must be a str or a list of messages, not int\n'
            'Error: prompt must be a str or a list of messages, not bytes\n'
            'Error: model must be a str or None, not int\n')
        self.assertEqual(worker.queries, [])
        out = self.stdout_of(worker, "print(llm_query_batched(['a', 2, 'b']))")
        self.assertEqual(out, "['echo:a', 'Error: a batched prompt must be a str, not int', "
                              "'echo:b']\n")
        self.assertEqual([q['prompts'] for q in worker.queries], [['a', 'b']])
        self.assertEqual(self.stdout_of(worker, "print(llm_query_batched(['a'], model=2))"),
                         "['Error: model must be a str or None, not int']\n")
        result = worker.execute("llm_query_batched('abc')")
        self.assertEqual(result['status'], 'error')
        self.assertIn('TypeError: llm_query_batched takes a list of str, not str',
                      result['error'])
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
        self.assertEqual(out, '20 20\nstr Error: model failed on FAIL 7\necho:p0 echo:p19\n')

    def test_rlm_query_asks_with_kind_rlm(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "print(rlm_query('sub', model='m'))\nprint(rlm_query('FAIL x'))\n"
            "print(rlm_query_batched(['a', 'FAIL b']))"))
        self.assertEqual(out, "rlm:sub\nError: model failed on FAIL x\n"
                              "['rlm:a', 'Error: model failed on FAIL b']\n")
        self.assertEqual([(q['type'], q.get('kind'), q.get('model')) for q in worker.queries],
                         [('llm_query', 'rlm', 'm'), ('llm_query', 'rlm', None),
                          ('llm_query_batched', 'rlm', None)])

    def test_llm_frames_carry_no_kind(self):
        # kind absent means "llm": the frames of today's llm_query are unchanged.
        worker = self.start()
        self.run_ok(worker, "llm_query('a')\nllm_query_batched(['b'])")
        self.assertEqual([q.get('kind', 'absent') for q in worker.queries], ['absent', 'absent'])

    def test_a_prompt_may_be_a_list_of_messages(self):
        worker = self.start()
        out = self.stdout_of(worker, (
            "msgs = [{'role': 'system', 'content': 'be brief'}, "
            "{'role': 'user', 'content': 'hi', 'name': 'dropped'}]\n"
            "print(llm_query(msgs))\nprint(rlm_query(tuple(msgs)))"))
        self.assertEqual(out, 'echo:system=be brief|user=hi\nrlm:system=be brief|user=hi\n')
        self.assertEqual(worker.queries[0]['prompt'], [
            {'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'hi'}])
        for call in ("llm_query([{'role': 'user'}])", "llm_query([{'role': 1, 'content': ''}])",
                     "llm_query(['hi'])"):
            self.assertEqual(self.stdout_of(worker, 'print(%s)' % call),
                             'Error: a prompt that is a list holds messages: dicts with a str '
                             '"role" and a str "content"\n', call)
        self.assertEqual(
            self.stdout_of(worker, "print(llm_query_batched([[{'role': 'u', 'content': 'x'}]]))"),
            "['Error: a batched prompt must be a str, not list']\n")
        over = self.stdout_of(worker, "print(llm_query([{'role': 'u', 'content': ''}] * 40000))")
        self.assertIn('Error: the prompt nests deeper than 62 levels or holds more than', over)
        self.assertEqual(len(worker.queries), 2)


if __name__ == '__main__':
    unittest.main()
