# The REPL globals every cell sees (context_N, history_N, answer, llm_query, llm_query_batched,
# rlm_query, rlm_query_batched, FINAL, FINAL_VAR, SHOW_VARS, the caller's tools), the
# per-interpreter Session they work on, and what a cell's end does to them: the answer taken,
# the reserved names restored (LocalREPL's _restore_scaffold), the variables listed or fetched.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import builtins
import json
import keyword
import re
import sys
import types

# The host refuses a frame nested deeper than 64 levels; a cell_result holds `final` and
# `fetched` two levels down, an llm_query its prompt one level down (docs/control-channel.md).
MAX_FINAL_DEPTH = 62
# The host refuses a frame holding more than 100,000 JSON values (each costs it up to ~100 bytes
# however small); a cell_result's own fields take a few of them.
MAX_FINAL_VALUES = 99900
MAX_BATCH = 10000  # prompts per llm_query_batched: the host ends the session beyond it
MAX_TOOLS = 64
MAX_LOCALS = 1000  # variables listed by execute's `locals`
LOCAL_REPR_CHARS = 200
# A listed variable also carries its JSON copy when it is this small (LocalREPL's REPLResult
# holds the values themselves, and the RLM library logs them).
LOCAL_VALUE_ITEMS = 256
LOCAL_VALUE_CHARS = 4096
LOCALS_VALUE_ITEMS = 20000  # of all the listed values together, within the frame's bound
# The worker's functions, restored after every cell whatever a cell bound to their names.
SCAFFOLD_FUNCTIONS = ('llm_query', 'llm_query_batched', 'rlm_query', 'rlm_query_batched',
                      'FINAL', 'FINAL_VAR', 'SHOW_VARS')
NUMBERED_NAME = re.compile(r'(context|history)_[0-9]+\Z')
NO_VARIABLES = 'No variables created yet. Use ```repl``` blocks to create variables.'


class Session:
    """Per-interpreter state (each fork carries its own copy)."""

    def __init__(self):
        self.channel = None
        self.namespace = {}
        self.scaffold = {}    # name -> what a cell finds there: the functions, then the tools
        self.contexts = {}    # index -> context_N's value (context is context_0)
        self.histories = {}   # index -> history_N's value (history is history_0)
        self.echo = True      # print a cell's trailing expression (the hand-over's options)
        self.final = None
        self.answer = None          # the AnswerDict cells see as `answer`
        self.answer_ready = False   # its "ready" when the cell started
        self.answer_content = None  # str(answer["content"]) when a cell set answer["ready"]
        self.shown_vars = None      # SHOW_VARS()'s last text: echoed as text, not as a repr
        self.next_capture = None  # made by the standby's warm_up for its cell
        self.op_came_at_once = False  # this standby's op came before it warmed up (warm_up)
        self.rolled_back = set()  # rollback ids this interpreter (or its ancestor) took
        self.watches = []         # a frozen interpreter's children (pidfds), armed or not
        self.handed_over = False  # the caller's hand-over has come (startup.py)
        self.pending_handover = None  # the first checkpoint's, applied before it forks
        self.worker_module = sys.modules.get('__main__')  # stays alive once cells own __main__


SESSION = Session()


class AnswerDict(dict):
    """`answer`: a plain dict to cells, except that setting answer["ready"] to a true value
    takes str(answer["content"]) as the cell's answer (LocalREPL's _AnswerDict)."""

    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        if key == 'ready' and value:
            try:
                SESSION.answer_content = str(self.get('content', ''))
            except Exception:
                pass


def new_answer() -> AnswerDict:
    return AnswerDict(content='', ready=False)


# -- calls to the host: the language model, sub-RLMs, tools


def check_model(model) -> None:
    if model is not None and not isinstance(model, str):
        raise TypeError('model must be a str or None, not %s' % type(model).__name__)


def check_json_size(value, what: str) -> None:
    """ValueError for a value the host would refuse in a frame (see MAX_FINAL_*)."""
    depth, values = json_shape(value)
    if depth > MAX_FINAL_DEPTH or values > MAX_FINAL_VALUES:
        raise ValueError('%s nests deeper than %d levels or holds more than %d values'
                         % (what, MAX_FINAL_DEPTH, MAX_FINAL_VALUES))


def check_prompt(prompt):
    """A str, or a list of {"role": str, "content": str} messages (copied)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        messages = []
        for message in prompt:
            if not isinstance(message, dict) or not isinstance(message.get('role'), str) or \
                    not isinstance(message.get('content'), str):
                raise TypeError('a prompt that is a list holds messages: dicts with a str '
                                '"role" and a str "content"')
            messages.append({'role': message['role'], 'content': message['content']})
        check_json_size(messages, 'the prompt')
        return messages
    raise TypeError('prompt must be a str or a list of messages, not %s'
                    % type(prompt).__name__)


def answer_text(answer: dict) -> str:
    """An llm_result's text, or the library's "Error: ..." for a failed call."""
    if isinstance(answer.get('error'), str):
        return 'Error: ' + answer['error']
    if not isinstance(answer.get('text'), str):
        protocol_violation('llm_result %r has neither a text nor an error string'
                           % answer.get('id'))
    return answer['text']


def refused_call(exc) -> str:
    """The text of a call that is not sent: LocalREPL hands any prompt to its LM handler, which
    answers one it cannot take with "Error: ...", so a cell gets that text, not an exception."""
    return 'Error: %s' % exc


def query_one(kind: str, prompt, model) -> str:
    try:
        check_model(model)
        message = {'type': 'llm_query', 'prompt': check_prompt(prompt), 'model': model}
    except (TypeError, ValueError) as exc:
        return refused_call(exc)
    if kind != 'llm':
        message['kind'] = kind
    return answer_text(SESSION.channel.query(message))


def query_batch(kind: str, prompts, model) -> list:
    """The answers in prompt order; a prompt that is not a str is answered "Error: ..." in its
    place (the others are still asked), and so is every prompt under a model that is no str."""
    name = 'llm_query_batched' if kind == 'llm' else 'rlm_query_batched'
    if not isinstance(prompts, (list, tuple)):
        raise TypeError('%s takes a list of str, not %s' % (name, type(prompts).__name__))
    if len(prompts) > MAX_BATCH:
        raise ValueError('%s takes at most %d prompts, not %d' % (name, MAX_BATCH, len(prompts)))
    try:
        check_model(model)
    except TypeError as exc:
        return [refused_call(exc)] * len(prompts)
    results = [None] * len(prompts)
    sent = []  # indexes of the prompts asked
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            sent.append(index)
        else:
            results[index] = refused_call(
                'a batched prompt must be a str, not %s' % type(prompt).__name__)
    if not sent:
        return results
    message = {'type': 'llm_query_batched', 'prompts': [prompts[i] for i in sent], 'model': model}
    if kind != 'llm':
        message['kind'] = kind
    answer = SESSION.channel.query(message)
    items = answer.get('items')
    if not isinstance(items, list) or len(items) != len(sent):
        protocol_violation('llm_results %r does not have one item per prompt' % answer.get('id'))
    for index, item in zip(sent, items):
        if not isinstance(item, dict) or not (isinstance(item.get('error'), str) or
                                              isinstance(item.get('text'), str)):
            protocol_violation('llm_results %r has an item with neither text nor error'
                               % answer.get('id'))
        results[index] = answer_text(item)
    return results


def llm_query(prompt, model=None):
    """Asks the host's language model (prompt: a str or a list of messages); returns its
    text, or "Error: <reason>" when the call failed or could not be made."""
    return query_one('llm', prompt, model)


def llm_query_batched(prompts, model=None):
    """Asks for several prompts at once; returns, in order, the text or "Error: <reason>"."""
    return query_batch('llm', prompts, model)


def rlm_query(prompt, model=None):
    """Asks a sub-RLM the host runs; returns its answer, or "Error: <reason>"."""
    return query_one('rlm', prompt, model)


def rlm_query_batched(prompts, model=None):
    """Several rlm_query at once; returns, in order, the answer or "Error: <reason>" each."""
    return query_batch('rlm', prompts, model)


def make_tool(name: str, description, python_values: bool = False):
    """A host tool: calling it sends its arguments to the host and returns the host's answer;
    a failed call raises RuntimeError. With python_values (the tool's "python" encoding) the
    arguments and answer keep their Python types (_pyvalues.py), and an exception the tool
    raised on the host is raised here as its own type."""

    def tool(*args, **kwargs):
        try:
            if python_values:
                payload = {'args': pyvalue_encode(list(args)),
                           'kwargs': {key: pyvalue_encode(value) for key, value in kwargs.items()}}
            else:
                payload = json.loads(json.dumps({'args': args, 'kwargs': kwargs},
                                                allow_nan=False))
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError('the arguments of %s must be %s (%s)' % (
                name, 'values a tool can take' if python_values else 'JSON values', exc)) \
                from None
        check_json_size(payload, 'the arguments of %s' % name)
        answer = SESSION.channel.query({'type': 'llm_query', 'kind': 'tool', 'tool': name,
                                        'prompt': payload, 'model': None})
        if isinstance(answer.get('error'), str):
            raise RuntimeError(answer['error'])
        if not isinstance(answer.get('text'), str):
            protocol_violation('llm_result %r has neither a text nor an error string'
                               % answer.get('id'))
        try:
            value = json.loads(answer['text'])
            if python_values:
                value = pyvalue_decode(value, allow_exception=True)
        except (ValueError, RecursionError):
            raise RuntimeError('the host answered %s with text that is not %s' % (
                name, 'an encoded value' if python_values else 'JSON')) from None
        if python_values and isinstance(value, BaseException):
            raise value
        return value

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = description
    return tool


class UnsendableValue:
    """A data tool whose value the host could not encode: any use of it raises TypeError
    saying why (the environment was still made, as LocalREPL's would be)."""

    def __init__(self, name: str, why: str):
        object.__setattr__(self, '_why', 'the value of %s could not be sent to the sandbox: %s'
                           % (name, why))

    def __getattr__(self, attribute):
        raise TypeError(object.__getattribute__(self, '_why'))

    def __repr__(self):
        return '<%s>' % object.__getattribute__(self, '_why')

    def __call__(self, *args, **kwargs):
        raise TypeError(object.__getattribute__(self, '_why'))

    def __iter__(self):
        raise TypeError(object.__getattribute__(self, '_why'))

    def __len__(self):
        raise TypeError(object.__getattribute__(self, '_why'))

    def __getitem__(self, key):
        raise TypeError(object.__getattribute__(self, '_why'))

    def __bool__(self):
        raise TypeError(object.__getattribute__(self, '_why'))


def tool_value(name: str, value, python_values: bool):
    """A data tool's value as cells see it."""
    if not python_values:
        return value
    try:
        decoded = pyvalue_decode(value, allow_unsent=True)
    except (ValueError, RecursionError) as exc:
        decoded = PyvalueError(str(exc))
    return UnsendableValue(name, str(decoded)) if isinstance(decoded, PyvalueError) else decoded


def check_tool_name(name) -> None:
    """ValueError unless name can be a tool: an identifier that is not a reserved name."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError('a tool name must be a Python identifier, not %r' % (name,))
    if name in SCAFFOLD_FUNCTIONS or name in ('answer', 'context', 'history') or \
            NUMBERED_NAME.match(name):
        raise ValueError('%r is a reserved name, not a tool name' % name)


def add_tools(tools) -> None:
    """The hand-over's tools, as globals restored after every cell like the functions.
    ValueError for a list the protocol does not allow."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ValueError('tools must be a list of at most %d tools' % MAX_TOOLS)
    made = {}
    for entry in tools:
        if not isinstance(entry, dict):
            raise ValueError('a tool is an object with a name')
        name, description = entry.get('name'), entry.get('description')
        check_tool_name(name)
        if name in made:
            raise ValueError('tool %r is given twice' % name)
        if description is not None and not isinstance(description, str):
            raise ValueError('the description of tool %r is not a string' % name)
        encoding = entry.get('encoding', 'json')
        if encoding not in ('json', 'python'):
            raise ValueError('the encoding of tool %r is neither "json" nor "python"' % name)
        python_values = encoding == 'python'
        made[name] = tool_value(name, entry['value'], python_values) if 'value' in entry \
            else make_tool(name, description, python_values)
    SESSION.scaffold.update(made)
    SESSION.namespace.update(made)


# -- FINAL, FINAL_VAR, SHOW_VARS


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


def final_value(value, max_values: int = MAX_FINAL_VALUES) -> dict:
    """A copy taken now: the cell may change the object before the result is sent. A value that
    is not JSON, or nests deeper or holds more values than the host takes, is sent as its
    repr()."""
    try:
        copy = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return {'value': safe_repr(value)}
    depth, values = json_shape(copy)
    if depth > MAX_FINAL_DEPTH or values > max_values:
        return {'value': safe_repr(value)}
    return {'value': copy}


def FINAL(value):
    """Sets the session's final answer (sent with this cell's result)."""
    SESSION.final = final_value(value)


def FINAL_VAR(name):
    """FINAL(the variable called name); returns str() of its value."""
    if not isinstance(name, str):
        raise TypeError('FINAL_VAR takes a variable name (a str)')
    caller = sys._getframe(1)
    for scope in (caller.f_locals, SESSION.namespace):
        if name in scope:
            value = scope[name]
            SESSION.final = final_value(value)
            return str(value)
    raise NameError('FINAL_VAR: no variable named %r' % name)


def shows_in_show_vars(name: str, value) -> bool:
    """What LocalREPL keeps in its locals: not _-names, answer, or the worker's functions and
    function tools (LocalREPL's globals)."""
    if name.startswith('_') or name == 'answer':
        return False
    return not (name in SESSION.scaffold and SESSION.scaffold[name] is value and callable(value))


def SHOW_VARS():
    """Returns LocalREPL's text: "Available variables: {name: type name, ...}"."""
    available = {name: type(value).__name__
                 for name, value in list(SESSION.namespace.items())
                 if shows_in_show_vars(name, value)}
    text = 'Available variables: %s' % (available,) if available else NO_VARIABLES
    SESSION.shown_vars = text
    return text


# -- contexts and histories


def set_context(kind: str, index, value) -> int:
    """Makes value context_N (history_N for kind 'history'), and context (history) when N is 0;
    index None is the next free one. Returns N."""
    table = SESSION.contexts if kind == 'context' else SESSION.histories
    if index is None:
        index = max(table) + 1 if table else 0
    table[index] = value
    SESSION.namespace['%s_%d' % (kind, index)] = value
    if index == 0:
        SESSION.namespace[kind] = value
    return index


# -- a cell's start and end


def begin_cell_globals() -> None:
    SESSION.final = None
    SESSION.answer_content = None
    SESSION.shown_vars = None
    try:
        SESSION.answer_ready = bool(dict.get(SESSION.answer, 'ready'))
    except Exception:
        SESSION.answer_ready = False


def take_answer():
    """The cell's answer (a str) or None: what setting answer["ready"] took, else the content of
    an `answer` dict that is ready at the cell's end and was not at its start (a rebound dict,
    answer.update(ready=True))."""
    if SESSION.answer_content is not None:
        return SESSION.answer_content
    current = SESSION.namespace.get('answer')
    if not isinstance(current, dict) or \
            (current is SESSION.answer and SESSION.answer_ready):
        return None
    try:
        return str(current.get('content', '')) if current.get('ready') else None
    except Exception:
        return None


def restore_scaffold() -> None:
    """Rebinds the reserved names a cell rebound or deleted (LocalREPL's _restore_scaffold): the
    functions and tools, context_N and history_N, context and history, and `answer` (a dict
    rebound to it is kept, as an AnswerDict with its items)."""
    namespace = SESSION.namespace
    for name, value in SESSION.scaffold.items():
        if namespace.get(name, namespace) is not value:
            namespace[name] = value
    for kind, table in (('context', SESSION.contexts), ('history', SESSION.histories)):
        for index, value in table.items():
            namespace['%s_%d' % (kind, index)] = value
        if 0 in table:
            namespace[kind] = table[0]
    current = namespace.get('answer')
    if not isinstance(current, AnswerDict):
        replacement = new_answer()
        if isinstance(current, dict):
            try:
                for key, value in list(current.items()):
                    dict.__setitem__(replacement, key, value)
            except Exception:
                pass
        namespace['answer'] = current = replacement
    SESSION.answer = current


def reserved_names() -> set:
    names = set(SESSION.scaffold) | {'answer'}
    if 0 in SESSION.contexts:
        names.add('context')
    names.update('context_%d' % index for index in SESSION.contexts)
    names.update('history_%d' % index for index in SESSION.histories)
    if 0 in SESSION.histories:
        names.add('history')
    return names


def short_repr(value) -> str:
    try:
        if isinstance(value, (str, bytes, bytearray)) and len(value) > LOCAL_REPR_CHARS:
            value = value[:LOCAL_REPR_CHARS]  # the repr's start, without the whole repr
        text = repr(value)
        if not isinstance(text, str):
            return '<unrepresentable>'
    except BaseException:  # the cell's own __repr__, whatever it raises
        return '<unrepresentable>'
    return text[:LOCAL_REPR_CHARS]


def small_json(value):
    """(True, a JSON copy of value) when it is JSON of at most LOCAL_VALUE_ITEMS values and
    LOCAL_VALUE_CHARS characters of text (tuples as lists, as the RLM library logs them), else
    (False, None); walked without recursion, giving up as soon as it is over."""
    items, chars, stack = 0, 0, [value]
    while stack:
        item = stack.pop()
        items += 1
        if items > LOCAL_VALUE_ITEMS:
            return False, None
        if item is None or isinstance(item, bool):
            continue
        if type(item) is int:
            chars += 4 if -1000 < item < 1000 else 24  # about its JSON text, without making it
        elif type(item) is float:
            chars += 24
        elif type(item) is str:
            chars += len(item)
        elif type(item) in (list, tuple):
            stack.extend(item)
        elif type(item) is dict:
            for key in item:
                if type(key) is not str:
                    return False, None
                chars += len(key)
            stack.extend(item.values())
        else:
            return False, None
        if chars > LOCAL_VALUE_CHARS:
            return False, None
    try:
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None


def list_locals() -> tuple:
    """The cells' variables, [{"name", "type", "repr", "value"?}] (what REPLResult.locals
    needs): not _-names, modules or the reserved names; at most MAX_LOCALS, each repr cut short,
    the value only when small_json() takes it and LOCALS_VALUE_ITEMS are not spent. Returns
    (the list, the JSON values it holds)."""
    reserved = reserved_names()
    found = []
    values = 1
    for name, value in list(SESSION.namespace.items()):
        if name.startswith('_') or name in reserved or isinstance(value, types.ModuleType):
            continue
        if len(found) == MAX_LOCALS:
            break
        entry = {'name': name, 'type': type(value).__name__, 'repr': short_repr(value)}
        values += 4
        small, copy = small_json(value) if values < LOCALS_VALUE_ITEMS else (False, None)
        if small:
            entry['value'] = copy
            values += 1 + json_shape(copy)[1]
        found.append(entry)
    return found, values


def fetch_variable(name: str, max_values: int) -> dict:
    """{"value": V} (V per the FINAL rules) or {"error": ...}."""
    namespace = SESSION.namespace
    if name not in namespace:
        return {'error': 'no variable named %r' % name}
    try:
        return final_value(namespace[name], max_values)
    except BaseException as exc:  # the value's own __repr__, whatever it raises
        return {'error': 'the value of %r cannot be shown (its repr() raised %s)'
                         % (name, type(exc).__name__)}


def end_cell_globals(result: dict, want_locals: bool, fetch) -> None:
    """Takes the cell's answer, restores the reserved names, then lists and fetches what the
    execute asked for, into the cell's result."""
    answer = take_answer()
    restore_scaffold()
    if answer is not None:
        result['answer'] = {'content': answer}
    budget = MAX_FINAL_VALUES
    if want_locals:
        result['locals'], listed = list_locals()
        budget -= listed
    if fetch is not None:
        if SESSION.final is not None:
            budget -= json_shape(SESSION.final)[1]
        result['fetched'] = fetch_variable(fetch, budget)


def make_namespace() -> dict:
    # A real module registered as __main__, so pickle finds classes and functions cells define.
    module = types.ModuleType('__main__')
    namespace = module.__dict__
    namespace['__builtins__'] = builtins
    SESSION.namespace = namespace
    SESSION.scaffold = {'llm_query': llm_query, 'llm_query_batched': llm_query_batched,
                        'rlm_query': rlm_query, 'rlm_query_batched': rlm_query_batched,
                        'FINAL': FINAL, 'FINAL_VAR': FINAL_VAR, 'SHOW_VARS': SHOW_VARS}
    namespace.update(SESSION.scaffold)
    restore_scaffold()  # answer (context is unbound until there is one, as in LocalREPL)
    sys.modules['__main__'] = module
    return namespace
