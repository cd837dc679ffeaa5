# The REPL globals every cell sees (context, llm_query, llm_query_batched, FINAL, FINAL_VAR,
# SHOW_VARS) and the per-interpreter Session they work on.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import builtins
import json
import sys
import types

# The host refuses a frame nested deeper than 64 levels; a cell_result holds `final` two levels
# down (docs/control-channel.md).
MAX_FINAL_DEPTH = 62
# The host refuses a frame holding more than 100,000 JSON values (each costs it up to ~100 bytes
# however small); a cell_result's own fields take a few of them.
MAX_FINAL_VALUES = 99900
MAX_BATCH = 10000  # prompts per llm_query_batched: the host ends the session beyond it


class Session:
    """Per-interpreter state (each fork carries its own copy)."""

    def __init__(self):
        self.channel = None
        self.namespace = {}
        self.api = {}
        self.final = None
        self.next_capture = None  # made by the standby's warm_up for its cell
        self.rolled_back = set()  # rollback ids this interpreter (or its ancestor) took
        self.watches = []         # a frozen interpreter's children (pidfds), armed or not
        self.handed_over = False  # the caller's hand-over has come (startup.py)
        self.pending_handover = None  # the first checkpoint's, applied before it forks
        self.worker_module = sys.modules.get('__main__')  # stays alive once cells own __main__


SESSION = Session()


def check_model(model) -> None:
    if model is not None and not isinstance(model, str):
        raise TypeError('model must be a str or None, not %s' % type(model).__name__)


def llm_query(prompt, model=None):
    """Asks the host's language model; returns its text or raises RuntimeError."""
    if not isinstance(prompt, str):
        raise TypeError('prompt must be a str, not %s' % type(prompt).__name__)
    check_model(model)
    answer = SESSION.channel.query({'type': 'llm_query', 'prompt': prompt, 'model': model})
    if isinstance(answer.get('error'), str):
        raise RuntimeError(answer['error'])
    if not isinstance(answer.get('text'), str):
        protocol_violation('llm_result %r has neither a text nor an error string'
                           % answer.get('id'))
    return answer['text']


def llm_query_batched(prompts, model=None):
    """Asks for several prompts at once; returns, in order, a str or an Exception each."""
    if not isinstance(prompts, (list, tuple)) or \
            not all(isinstance(p, str) for p in prompts):
        raise TypeError('prompts must be a list of str')
    if len(prompts) > MAX_BATCH:
        raise ValueError('llm_query_batched takes at most %d prompts, not %d'
                         % (MAX_BATCH, len(prompts)))
    check_model(model)
    if not prompts:
        return []
    answer = SESSION.channel.query(
        {'type': 'llm_query_batched', 'prompts': list(prompts), 'model': model})
    items = answer.get('items')
    if not isinstance(items, list) or len(items) != len(prompts):
        protocol_violation('llm_results %r does not have one item per prompt' % answer.get('id'))
    results = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get('error'), str):
            results.append(RuntimeError(item['error']))
        elif isinstance(item, dict) and isinstance(item.get('text'), str):
            results.append(item['text'])
        else:
            protocol_violation('llm_results %r has an item with neither text nor error'
                               % answer.get('id'))
    return results


def json_shape(value):
    """(depth, values) of a JSON value: how deep lists and dicts nest (a scalar is 0), and how
    many values it holds (every scalar, list and dict), without recursion."""
    depth, values, stack = 0, 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        values += 1
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in item)
    return depth, values


def safe_repr(value) -> str:
    try:
        return repr(value)
    except RecursionError:
        return '<a %s nested too deep to show>' % type(value).__name__


def final_value(value) -> dict:
    """A copy taken now: the cell may change the object before the result is sent. A value that
    is not JSON, or nests deeper or holds more values than the host takes, is sent as its
    repr()."""
    try:
        copy = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return {'value': safe_repr(value)}
    depth, values = json_shape(copy)
    if depth > MAX_FINAL_DEPTH or values > MAX_FINAL_VALUES:
        return {'value': safe_repr(value)}
    return {'value': copy}


def FINAL(value):
    """Sets the session's final answer (sent with this cell's result)."""
    SESSION.final = final_value(value)


def FINAL_VAR(name):
    """FINAL(the variable called name)."""
    if not isinstance(name, str):
        raise TypeError('FINAL_VAR takes a variable name (a str)')
    caller = sys._getframe(1)
    for scope in (caller.f_locals, SESSION.namespace):
        if name in scope:
            SESSION.final = final_value(scope[name])
            return
    raise NameError('FINAL_VAR: no variable named %r' % name)


def SHOW_VARS():
    """Prints and returns {name: type name} of the variables the cells have made."""
    table = VarTable()
    for name, value in SESSION.namespace.items():
        if name.startswith('_') or isinstance(value, types.ModuleType):
            continue
        if name in SESSION.api and SESSION.api[name] is value:
            continue
        table[name] = type(value).__name__
    if table:
        print('\n'.join('%s: %s' % item for item in table.items()))
    else:
        print('(no variables)')
    return table


def make_namespace(context) -> dict:
    # A real module registered as __main__, so pickle finds classes and functions cells define.
    module = types.ModuleType('__main__')
    namespace = module.__dict__
    namespace['__builtins__'] = builtins
    SESSION.api = {'context': context, 'llm_query': llm_query,
                   'llm_query_batched': llm_query_batched, 'FINAL': FINAL,
                   'FINAL_VAR': FINAL_VAR, 'SHOW_VARS': SHOW_VARS}
    namespace.update(SESSION.api)
    sys.modules['__main__'] = module
    return namespace
