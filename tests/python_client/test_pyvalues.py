"""The "python" tool encoding (python/rlm_sandbox/_pyvalues.py) on its own: what round-trips,
what is refused, and the bounds the host side holds a sandbox's values to."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from rlm_sandbox._pyvalues import (  # noqa: E402
    PYVALUE_MAX_DEPTH, PYVALUE_MAX_HASHED, PyvalueError, pyvalue_decode, pyvalue_encode,
    pyvalue_encode_exception)


def through_json(value):
    return json.loads(json.dumps(pyvalue_encode(value), allow_nan=False))


class RoundTrip(unittest.TestCase):
    def test_python_values_come_back_equal_in_type_and_order(self):
        value = {"z": (1, [2.5, None]), 3: {b"\x00", frozenset({"a"})}, (1, "k"): 1j,
                 "ba": bytearray(b"q"), "inf": float("-inf"), True: "t"}
        back = pyvalue_decode(through_json(value))
        self.assertEqual(back, value)
        self.assertEqual(list(back), list(value))
        self.assertIsInstance(back["z"], tuple)
        self.assertIsInstance(back["ba"], bytearray)
        nan = pyvalue_decode(through_json(float("nan")))
        self.assertNotEqual(nan, nan)

    def test_every_object_is_a_tag_of_one_key(self):
        self.assertEqual(through_json({"a": 1}), {"d": [["a", 1]]})
        self.assertEqual(through_json((1,)), {"t": [1]})

    def test_other_objects_are_refused_with_their_type(self):
        with self.assertRaisesRegex(PyvalueError, "a value of type object cannot be sent"):
            pyvalue_encode([object()])
        deep = []
        for _ in range(PYVALUE_MAX_DEPTH + 2):
            deep = [deep]
        with self.assertRaisesRegex(PyvalueError, "nests deeper"):
            pyvalue_encode(deep)


class Exceptions(unittest.TestCase):
    def decoded(self, error):
        data = json.loads(json.dumps(pyvalue_encode_exception(error)))
        return pyvalue_decode(data, allow_exception=True)

    def test_builtin_types_are_themselves_with_their_args(self):
        error = self.decoded(KeyError(("k", 1)))
        self.assertIs(type(error), KeyError)
        self.assertEqual(error.args, (("k", 1),))
        self.assertIs(type(self.decoded(UnicodeDecodeError("utf-8", b"x", 0, 1, "bad"))),
                      UnicodeDecodeError)

    def test_a_type_of_its_own_keeps_its_name_on_its_builtin_base(self):
        class NotFound(LookupError):
            pass
        error = self.decoded(NotFound("x", object()))
        self.assertEqual(type(error).__name__, "NotFound")
        self.assertIsInstance(error, LookupError)

    def test_what_would_end_an_interpreter_becomes_runtime_error(self):
        error = self.decoded(SystemExit(3))
        self.assertIs(type(error), RuntimeError)
        self.assertEqual(str(error), "SystemExit: 3")

    def test_an_exception_or_unsent_value_only_where_allowed(self):
        with self.assertRaises(PyvalueError):
            pyvalue_decode({"e": ["KeyError", "KeyError", []]})
        with self.assertRaises(PyvalueError):
            pyvalue_decode([{"u": "why"}], allow_unsent=True)  # only the value itself
        self.assertIsInstance(pyvalue_decode({"u": "why"}, allow_unsent=True), PyvalueError)


class HostileInput(unittest.TestCase):
    def test_malformed_tags_are_refused(self):
        for data in ({"q": 1}, {"a": 1, "b": 2}, {"d": [[1]]}, {"d": [[[1], 2]]}, {"s": [[1]]},
                     {"b": "!!"}, {"b": 1}, {"n": "1e9"}, {"c": [1]}, {"c": ["1", 2]}, {"d": 3}):
            with self.subTest(data=data), self.assertRaises(PyvalueError):
                pyvalue_decode(data)

    def test_colliding_keys_are_bounded_when_the_value_came_from_a_sandbox(self):
        modulus = (1 << 61) - 1  # ints hash modulo it: its multiples all collide
        colliding = {"s": [k * modulus for k in range(1, PYVALUE_MAX_HASHED + 2)]}
        with self.assertRaisesRegex(PyvalueError, "more than 4096 set items"):
            pyvalue_decode(colliding, budget=[PYVALUE_MAX_HASHED])
        keys = {"d": [[k * modulus, 0] for k in range(1, PYVALUE_MAX_HASHED + 2)]}
        with self.assertRaises(PyvalueError):
            pyvalue_decode(keys, budget=[PYVALUE_MAX_HASHED])
        strings = {"s": [str(k) for k in range(2 * PYVALUE_MAX_HASHED)]}  # randomized hashes
        self.assertEqual(len(pyvalue_decode(strings, budget=[PYVALUE_MAX_HASHED])),
                         2 * PYVALUE_MAX_HASHED)
        self.assertEqual(len(pyvalue_decode(colliding)), PYVALUE_MAX_HASHED + 1)  # host's own


if __name__ == "__main__":
    unittest.main()
