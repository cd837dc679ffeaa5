"""Python values as JSON, for host tools whose encoding is ``"python"``.

Plain JSON loses what a tool's callers in ``LocalREPL`` keep: tuples, sets, bytes, a dict's key
order and its non-str keys, ``nan``, and the type of an exception the tool raised. With the
``"python"`` encoding a value crosses as JSON in which every object is a tag of one key:

======================  ========================================================
``{"d": [[k, v], ...]}``  a dict, its items in order (keys: any encodable value)
``{"t": [...]}``          a tuple
``{"s": [...]}``          a set; ``{"f": [...]}`` a frozenset
``{"b": "<base64>"}``     bytes; ``{"a": "<base64>"}`` a bytearray
``{"n": "nan"}``          a float that JSON has no number for (``nan``, ``inf``, ``-inf``)
``{"c": [re, im]}``       a complex number
``{"e": [name, base, [args...]]}``  an exception a tool raised (its answer only): the type's
                          name, its nearest builtin base class, its args
``{"u": "why"}``          a data tool's value that could not be encoded
======================  ========================================================

Lists, str, int, float, bool and None are themselves. One definition serves both sides: the
client package imports this module, and the sandbox's REPL worker has it as one of its parts
(worker/python/parts.txt), so it uses nothing but the standard library and defines only
``pyvalue_*`` names.
"""

import base64
import builtins
import math

#: How deep a value may nest: the host refuses a frame nested deeper than 64 levels, and a
#: tool's call or answer sits a few levels down in its frame.
PYVALUE_MAX_DEPTH = 56
#: Set items and dict keys that are not str or bytes that one value from a sandbox may hold:
#: their hashes are not randomized, so a sandbox could send keys that all collide and make each
#: insertion scan the others (100,000 such ints take the host ~30 s; 4,096 take 0.04 s).
PYVALUE_MAX_HASHED = 4096


class PyvalueError(ValueError):
    """A value that cannot be encoded, or JSON that is not an encoded value."""


def pyvalue_encode(value, depth: int = 0):
    """The JSON form of ``value``; PyvalueError for what it cannot carry (other objects)."""
    if depth > PYVALUE_MAX_DEPTH:
        raise PyvalueError('the value nests deeper than %d levels' % PYVALUE_MAX_DEPTH)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {'n': repr(value)}
    inner = depth + 1
    if isinstance(value, list):
        return [pyvalue_encode(item, inner) for item in value]
    if isinstance(value, dict):
        return {'d': [[pyvalue_encode(key, inner + 1), pyvalue_encode(item, inner + 1)]
                      for key, item in value.items()]}
    if isinstance(value, tuple):
        return {'t': [pyvalue_encode(item, inner) for item in value]}
    if isinstance(value, (set, frozenset)):
        tag = 'f' if isinstance(value, frozenset) else 's'
        return {tag: [pyvalue_encode(item, inner) for item in value]}
    if isinstance(value, bytes):
        return {'b': base64.b64encode(value).decode('ascii')}
    if isinstance(value, bytearray):
        return {'a': base64.b64encode(bytes(value)).decode('ascii')}
    if isinstance(value, complex):
        return {'c': [pyvalue_encode(value.real, inner), pyvalue_encode(value.imag, inner)]}
    raise PyvalueError('a value of type %s cannot be sent between the host and the sandbox '
                       '(tools take JSON values, tuples, sets, bytes and dicts of them)'
                       % type(value).__name__)


def pyvalue_encode_exception(error: BaseException):
    """The ``{"e": ...}`` tag of an exception: its args encoded where they can be, else the
    exception's text as its one argument."""
    base = next((cls for cls in type(error).__mro__
                 if getattr(builtins, cls.__name__, None) is cls), Exception)
    try:
        args = pyvalue_encode(list(error.args))
    except PyvalueError:
        args = [str(error)]
    return {'e': [type(error).__name__, base.__name__, args]}


def _pyvalue_float(text):
    if text not in ('nan', 'inf', '-inf'):
        raise PyvalueError('%r is not a float JSON lacks' % (text,))
    return float(text)


def _pyvalue_bytes(text):
    if not isinstance(text, str):
        raise PyvalueError('bytes are base64 text')
    try:
        return base64.b64decode(text.encode('ascii'), validate=True)
    except (ValueError, UnicodeError):
        raise PyvalueError('bytes that are not base64') from None


def _pyvalue_hashed(items, budget) -> None:
    """Spends the budget of non-str hashed items (None: unbounded, the host's own values)."""
    if budget is None:
        return
    budget[0] -= sum(1 for item in items if not isinstance(item, (str, bytes)))
    if budget[0] < 0:
        raise PyvalueError('a value from the sandbox holds more than %d set items and dict '
                           'keys other than str' % PYVALUE_MAX_HASHED)


def pyvalue_decode(data, depth: int = 0, allow_exception: bool = False, budget=None,
                   allow_unsent: bool = False):
    """The value ``data`` encodes. PyvalueError for JSON that is not an encoded value (an
    object with another key, an unhashable key or set item, an exception or an unsent value
    where none may be); an ``{"e"}`` tag (``allow_exception``: a tool's answer) decodes to the
    exception (not raised), a top-level ``{"u"}`` (``allow_unsent``: a data tool's value) to a
    PyvalueError.
    ``budget`` (a one-item list) bounds the set items and dict keys that are not str: give
    ``[PYVALUE_MAX_HASHED]`` for a value that came from a sandbox."""
    if depth > PYVALUE_MAX_DEPTH + 4:
        raise PyvalueError('the value nests too deep')
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    inner = depth + 1
    if isinstance(data, list):
        return [pyvalue_decode(item, inner, False, budget) for item in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise PyvalueError('an encoded value has objects of one key only')
    (tag, body), = data.items()
    try:
        if tag == 'd' and isinstance(body, list):
            pairs = []
            for pair in body:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise PyvalueError('a dict item is a [key, value] pair')
                pairs.append((pyvalue_decode(pair[0], inner + 1, False, budget),
                              pyvalue_decode(pair[1], inner + 1, False, budget)))
            _pyvalue_hashed((key for key, _ in pairs), budget)
            return dict(pairs)
        if tag in ('t', 's', 'f') and isinstance(body, list):
            items = [pyvalue_decode(item, inner, False, budget) for item in body]
            if tag != 't':
                _pyvalue_hashed(items, budget)
            return {'t': tuple, 's': set, 'f': frozenset}[tag](items)
        if tag == 'b':
            return _pyvalue_bytes(body)
        if tag == 'a':
            return bytearray(_pyvalue_bytes(body))
        if tag == 'n':
            return _pyvalue_float(body)
        if tag == 'c' and isinstance(body, list) and len(body) == 2 and \
                all(isinstance(part, (int, float)) and not isinstance(part, bool)
                    for part in body):
            return complex(body[0], body[1])
        if tag == 'u' and allow_unsent and isinstance(body, str):
            return PyvalueError(body)
        if tag == 'e' and allow_exception and isinstance(body, list) and len(body) == 3:
            return _pyvalue_exception(body, inner)
    except TypeError as error:  # an unhashable key or set item
        raise PyvalueError('not an encoded value: %s' % error) from None
    raise PyvalueError('not an encoded value: a tag %r' % (str(tag)[:20],))


def _pyvalue_exception(body, depth):
    name, base_name, args = body
    if not isinstance(name, str) or not isinstance(base_name, str) or \
            not isinstance(args, list):
        raise PyvalueError('an exception is [name, base, [args]]')
    args = [pyvalue_decode(item, depth) for item in args]
    base = getattr(builtins, base_name, None)
    if not (isinstance(base, type) and issubclass(base, BaseException)):
        base = Exception
    if not issubclass(base, Exception):  # SystemExit...: not to end the cell's interpreter
        return RuntimeError('%s: %s' % (name, ', '.join(repr(arg) for arg in args)))
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        # A type of the tool's own: one of that name, of its nearest builtin base, so that
        # `except ValueError` still catches it.
        cls = type(name if name.isidentifier() else base.__name__, (base,), {})
    for make in (cls, base, Exception):
        try:
            return make(*args)
        except Exception:  # a constructor that wants other arguments (UnicodeDecodeError...)
            continue
    return Exception(name)
