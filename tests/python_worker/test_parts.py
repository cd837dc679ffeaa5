"""The worker is one script made of parts (worker/python/parts.txt): the script the tests run is
the parts concatenated, and no part rebinds a name another part defines (they share one global
namespace, so a clash would silently replace the earlier definition)."""

import ast
import os
import unittest

from worker_host import SOURCE, concatenate_parts, worker_parts


def top_level_names(tree):
    """Names a module binds at its top level (imports aside)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


class PartsTest(unittest.TestCase):
    def test_the_script_under_test_is_the_parts_concatenated(self):
        self.assertEqual(SOURCE, concatenate_parts(),
                         'the worker script is stale: rebuild (it is made from worker/python/)')

    def test_no_part_rebinds_a_name_of_another(self):
        owner = {}
        for path in worker_parts():
            with open(path, encoding='utf-8') as part:
                tree = ast.parse(part.read(), path)
            for name in top_level_names(tree):
                self.assertNotIn(name, owner, '%s is bound by %s and %s' % (
                    name, owner.get(name), os.path.basename(path)))
                owner[name] = os.path.basename(path)


if __name__ == '__main__':
    unittest.main()
