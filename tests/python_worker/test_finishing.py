"""Finishing a run: the `answer` dict (answer["ready"] = True, as the RLM library's LocalREPL),
and the older FINAL / FINAL_VAR."""

import unittest

from worker_host import WorkerTestCase


class AnswerTest(WorkerTestCase):
    def test_setting_ready_reports_the_content_once(self):
        worker = self.start()
        self.assertNotIn('answer', self.run_ok(worker, "answer['content'] = 'draft'"))
        done = self.run_ok(worker, "answer['content'] = 42\nanswer['ready'] = True")
        self.assertEqual(done['answer'], {'content': '42'})  # str() of the content
        # Still ready, but not set again: not reported again (LocalREPL).
        self.assertNotIn('answer', self.run_ok(worker, 'x = 1'))
        self.assertEqual(self.stdout_of(worker, 'print(answer)'),
                         "{'content': 42, 'ready': True}\n")
        again = self.run_ok(worker, "answer['content'] = 'second'\nanswer['ready'] = True")
        self.assertEqual(again['answer'], {'content': 'second'})

    def test_the_content_is_taken_when_ready_is_set(self):
        worker = self.start()
        result = self.run_ok(worker, (
            "answer['content'] = 'first'\nanswer['ready'] = True\n"
            "answer['content'] = 'changed later'"))
        self.assertEqual(result['answer'], {'content': 'first'})

    def test_a_cell_that_raises_after_setting_ready_still_reports_it(self):
        worker = self.start()
        result = worker.execute("answer['content'] = 'x'\nanswer['ready'] = True\n1 / 0")
        self.assertEqual(result['status'], 'error')
        self.assertEqual(result['answer'], {'content': 'x'})

    def test_a_rebound_plain_dict_is_reported_and_wrapped_again(self):
        worker = self.start()
        result = self.run_ok(worker, "answer = {'content': 'plain', 'ready': True}")
        self.assertEqual(result['answer'], {'content': 'plain'})
        out = self.stdout_of(worker, "print(type(answer).__name__, answer['content'])")
        self.assertEqual(out, 'AnswerDict plain\n')
        # Wrapped again, so setting ready signals once more.
        self.assertEqual(self.run_ok(worker, "answer['content'] = 'next'\n"
                                             "answer['ready'] = 1")['answer'],
                         {'content': 'next'})

    def test_ready_set_by_update_is_seen_at_the_end_of_the_cell(self):
        worker = self.start()
        result = self.run_ok(worker, "answer.update(content=['a', 1], ready=True)")
        self.assertEqual(result['answer'], {'content': "['a', 1]"})

    def test_a_rebound_non_dict_is_replaced_by_a_fresh_answer(self):
        worker = self.start()
        self.assertNotIn('answer', self.run_ok(worker, 'answer = 5'))
        self.assertEqual(self.stdout_of(worker, 'answer'), "{'content': '', 'ready': False}\n")

    def test_the_answer_survives_a_rollback_as_the_checkpoint_had_it(self):
        worker = self.start()
        self.run_ok(worker, "answer['content'] = 'kept'")
        op_id, parent, child = worker.begin("answer['content'] = 'lost'\nimport os\nos._exit(3)")
        worker.expect_rolled_back(parent, None)
        self.assertEqual(self.stdout_of(worker, "answer['content']"), "'kept'\n")


class FinalTest(WorkerTestCase):
    def test_final_var_returns_the_value_as_str_and_sets_final(self):
        worker = self.start()
        result = self.run_ok(worker, "x = {'n': [1, 2]}\nprint(FINAL_VAR('x'))")
        self.assertEqual(result['stdout'], "{'n': [1, 2]}\n")
        self.assertEqual(result['final'], {'value': {'n': [1, 2]}})
        self.assertNotIn('answer', result)

    def test_final_and_answer_in_one_cell_are_both_reported(self):
        worker = self.start()
        result = self.run_ok(worker, "FINAL(1)\nanswer['content'] = 'two'\nanswer['ready'] = True")
        self.assertEqual((result['final'], result['answer']), ({'value': 1}, {'content': 'two'}))

    def test_an_answer_too_large_for_a_frame_is_dropped_with_an_error(self):
        worker = self.start(max_frame=64 * 1024)
        result = worker.execute("answer['content'] = 'a' * 100000\nanswer['ready'] = True")
        self.assertEqual(result['status'], 'error')
        self.assertNotIn('answer', result)
        self.assertIn('the ANSWER value is too large for the control channel', result['error'])


if __name__ == '__main__':
    unittest.main()
