"""The hand-over's options: echo, and the caller's tools (functions the host answers through
llm_query frames of kind "tool", and data values)."""

import unittest

from worker_host import WorkerTestCase, write_frame


class OptionsTestCase(WorkerTestCase):
    def start_with(self, **options):
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        reply = worker.hand_over(options=options)
        self.assertNotIn('error', reply)
        return worker

    def refused(self, **options):
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        return worker.hand_over(options=options).get('error')


class ToolTest(OptionsTestCase):
    def test_a_function_tool_sends_its_json_arguments_and_returns_the_hosts_value(self):
        worker = self.start_with(tools=[{'name': 'lookup', 'description': 'Finds a key.'}])
        out = self.stdout_of(worker, "r = lookup('k', (1, 2), depth=3)\nprint(r)\n"
                                     "print(lookup.__name__, lookup.__doc__)")
        self.assertEqual(out, "{'tool': 'lookup', 'args': ['k', [1, 2]], 'kwargs': "
                              "{'depth': 3}}\nlookup Finds a key.\n")
        self.assertEqual(worker.queries[-1], {
            'type': 'llm_query', 'id': worker.queries[-1]['id'], 'kind': 'tool',
            'tool': 'lookup', 'prompt': {'args': ['k', [1, 2]], 'kwargs': {'depth': 3}},
            'model': None})

    def test_a_failed_tool_call_raises_runtime_error(self):
        worker = self.start_with(tools=[{'name': 'fail'}, {'name': 'garbage'}])
        out = self.stdout_of(worker, (
            "for call in (lambda: fail(1), garbage):\n"
            "    try:\n        call()\n"
            "    except RuntimeError as e:\n        print(e)"))
        self.assertEqual(out, 'tool fail refused [1]\n'
                              'the host answered garbage with text that is not JSON\n')

    def test_arguments_that_are_not_json_raise_type_error_and_send_nothing(self):
        worker = self.start_with(tools=[{'name': 'lookup'}])
        for call in ('lookup(object())', "lookup(float('nan'))", 'lookup({1: 2j})'):
            result = worker.execute(call)
            self.assertEqual(result['status'], 'error', call)
            self.assertIn('TypeError: the arguments of lookup must be JSON values',
                          result['error'])
        too_deep = worker.execute('v = 0\nfor _ in range(70): v = [v]\nlookup(v)')
        self.assertIn('ValueError: the arguments of lookup nests deeper', too_deep['error'])
        self.assertEqual(worker.queries, [])

    def test_a_data_tool_is_its_json_value(self):
        worker = self.start_with(tools=[{'name': 'table', 'value': {'rows': [1, 2]}},
                                        {'name': 'nothing', 'value': None}])
        self.assertEqual(self.stdout_of(worker, "print(table['rows'], nothing)"), '[1, 2] None\n')
        # A data tool is a variable to SHOW_VARS (LocalREPL keeps data tools in its locals).
        self.assertEqual(self.stdout_of(worker, 'print(SHOW_VARS())'),
                         "Available variables: {'table': 'dict', 'nothing': 'NoneType'}\n")

    def test_tool_names_the_protocol_refuses_fail_the_handover(self):
        for tools, reason in (
                ([{'name': 'llm_query'}], "'llm_query' is a reserved name"),
                ([{'name': 'context_3'}], "'context_3' is a reserved name"),
                ([{'name': 'answer'}], "'answer' is a reserved name"),
                ([{'name': 'not valid'}], 'must be a Python identifier'),
                ([{'name': 'class'}], 'must be a Python identifier'),
                ([{'name': 'a'}, {'name': 'a'}], "tool 'a' is given twice"),
                ([{'name': 'a', 'description': 3}], 'the description of tool'),
                ([{'name': 't%d' % i} for i in range(65)], 'at most 64 tools'),
                ('lookup', 'tools must be a list')):
            error = self.refused(tools=tools)
            self.assertIsNotNone(error, tools)
            self.assertIn(reason, error)

    def test_64_tools_are_taken(self):
        worker = self.start_with(tools=[{'name': 't%d' % i} for i in range(64)])
        self.assertEqual(self.stdout_of(worker, "t63(1)['tool']"), "'t63'\n")

    def test_the_first_checkpoint_gives_a_rolled_back_first_cell_the_tools(self):
        worker = self.start_with(tools=[{'name': 'table', 'value': 7}], echo=False)
        op_id, parent, child = worker.begin('while True:\n    pass')
        write_frame(parent, {'op': 'rollback', 'id': op_id, 'reason': 'timeout'})
        worker.expect_rolled_back(parent, op_id)
        self.assertEqual(self.stdout_of(worker, 'table\nprint(table)'), '7\n')


class EchoTest(OptionsTestCase):
    def test_echo_off_prints_no_trailing_expression(self):
        worker = self.start_with(echo=False)
        self.assertEqual(self.stdout_of(worker, "1 + 1"), '')
        self.assertEqual(self.stdout_of(worker, "x = 3\nprint(x)\nx"), '3\n')
        self.assertEqual(self.stdout_of(worker, 'SHOW_VARS()'), '')

    def test_echo_on_is_the_default(self):
        worker = self.start_with()
        self.assertEqual(self.stdout_of(worker, "1 + 1"), '2\n')

    def test_options_of_the_wrong_type_fail_the_handover(self):
        self.assertIn('echo must be a boolean', self.refused(echo='no'))
        worker = self.start(hello=False)
        worker.hello(hand_over=False)
        self.assertIn('options must be an object', worker.hand_over(options=[1])['error'])


if __name__ == '__main__':
    unittest.main()
