# A session's state written to an fd (the save op) and read back into another session (the load
# op), both answered by the standby like a cell. The host frames, bounds and checks the bytes;
# their content is read only here, inside a sandbox, so a hostile save file can do no more than
# a cell could. docs/sessions.md, "Save and restore".
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import importlib
import marshal
import mmap
import pickle
# Imported at the REPL's start (about a millisecond, before any caller waits): a fork's branch
# loads the moment it is handed over.
import shutil
import tarfile
import tempfile
import types

SAVE_FORMAT = 1
SAVED_DIRECTORIES = ('/tmp',)  # the writable files a save keeps (binds and /dev/shm are not);
# a load writes them aside in /tmp first (staged_files)
MAX_SKIPPED = 1000  # variables a save reports it could not keep


class SaveError(Exception):
    pass


def make_function(code: bytes, name: str, closure_size: int):
    """A function of a cell's, rebuilt from its marshalled code in this session's globals; its
    defaults, closure contents and attributes come after (fill_function), so a function may
    refer to itself."""
    closure = tuple(types.CellType() for _ in range(closure_size)) or None
    return types.FunctionType(marshal.loads(code), SESSION.namespace, name, None, closure)


def fill_function(function, state: dict):
    function.__defaults__ = state['defaults']
    function.__kwdefaults__ = state['kwdefaults']
    function.__qualname__ = state['qualname']
    function.__doc__ = state['doc']
    function.__annotations__ = state['annotations']
    function.__dict__.update(state['dict'])
    for cell, (full, value) in zip(function.__closure__ or (), state['closure']):
        if full:
            cell.cell_contents = value
    return function


def make_class(metaclass, name: str, bases: tuple, slots):
    """A class of a cell's, empty until fill_class: its methods may refer to it."""
    body = {'__module__': '__main__'}
    if slots is not None:
        body['__slots__'] = slots
    return metaclass(name, bases, body)


def fill_class(cls, state: dict):
    for key, value in state.items():
        setattr(cls, key, value)
    return cls


def answer_dict(items: dict):
    answer = new_answer()
    for key, value in items.items():
        dict.__setitem__(answer, key, value)
    return answer


def cell_closure_state(function) -> list:
    state = []
    for cell in function.__closure__ or ():
        try:
            state.append((True, cell.cell_contents))
        except ValueError:  # a variable not assigned yet
            state.append((False, None))
    return state


CLASS_SKIPPED_KEYS = ('__dict__', '__weakref__', '__module__', '__slots__', '_abc_impl')
# The worker's own functions a pickle refers to (the rebuilders above): by name, since
# sys.modules['__main__'] is the cells' module, not the worker's.
WORKER_HELPERS = ('make_function', 'fill_function', 'make_class', 'fill_class', 'answer_dict')


class StatePickler(pickle.Pickler):
    """Pickles the REPL's globals: what cells defined (functions, classes) by value, modules by
    name, the REPL's own functions and its globals by reference to the restoring session's."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.references = {id(SESSION.namespace): ('namespace',), id(builtins): ('builtins',)}
        for name, value in SESSION.scaffold.items():
            if callable(value) or isinstance(value, UnsendableValue):
                self.references[id(value)] = ('scaffold', name)
        for name in WORKER_HELPERS:
            self.references[id(globals()[name])] = ('worker', name)

    def persistent_id(self, obj):
        return self.references.get(id(obj))

    def reducer_override(self, obj):
        if isinstance(obj, types.ModuleType):
            if obj.__name__ == '__main__':
                return importlib.import_module, ('__main__',)
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, AnswerDict):
            return answer_dict, (dict(obj),)
        if isinstance(obj, types.FunctionType) and obj.__globals__ is SESSION.namespace:
            state = {'defaults': obj.__defaults__, 'kwdefaults': obj.__kwdefaults__,
                     'qualname': obj.__qualname__, 'doc': obj.__doc__,
                     'annotations': obj.__annotations__, 'dict': dict(obj.__dict__),
                     'closure': cell_closure_state(obj)}
            return (make_function,
                    (marshal.dumps(obj.__code__), obj.__name__, len(obj.__closure__ or ())),
                    state, None, None, fill_function)
        if isinstance(obj, type) and obj.__module__ == '__main__' and \
                not self.is_workers_own(obj):
            slots = obj.__dict__.get('__slots__')
            state = {key: value for key, value in obj.__dict__.items()
                     if key not in CLASS_SKIPPED_KEYS and
                     not (slots is not None and isinstance(value, types.MemberDescriptorType))}
            return (make_class, (type(obj), obj.__name__, obj.__bases__, slots), state, None,
                    None, fill_class)
        return NotImplemented

    @staticmethod
    def is_workers_own(cls) -> bool:
        return getattr(SESSION.worker_module, cls.__qualname__, None) is cls


class StateUnpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid == ('namespace',):
            return SESSION.namespace
        if pid == ('builtins',):
            return builtins
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == 'scaffold':
            return SESSION.scaffold.get(pid[1])
        if isinstance(pid, tuple) and len(pid) == 2 and pid[1] in WORKER_HELPERS:
            return globals()[pid[1]]
        raise pickle.UnpicklingError('unknown reference %r' % (pid,))

    def find_class(self, module, name):
        if module == '__main__' and name not in ('AnswerDict', 'UnsendableValue'):
            raise pickle.UnpicklingError('no %s in the worker' % name)
        return super().find_class(module, name) if module != '__main__' else globals()[name]


class Discard:
    """A file that keeps nothing: pickling into it only finds what cannot be pickled."""

    @staticmethod
    def write(data) -> int:
        return len(data)


def write_part(out, produce) -> None:
    """A part: its length (8 bytes, little-endian), then what produce(out) writes, streamed into
    the file (a large value is never held twice)."""
    start = out.tell()
    out.write(bytes(8))
    produce(out)
    end = out.tell()
    out.seek(start)
    out.write((end - start - 8).to_bytes(8, 'little'))
    out.seek(end)


def saved_variables() -> dict:
    reserved = reserved_names() | {'__builtins__', '__name__', '__doc__', '__loader__',
                                   '__spec__', '__package__'}
    return {name: value for name, value in SESSION.namespace.items()
            if name not in reserved or name == 'answer'}


def unpicklable(variables: dict) -> list:
    """Takes out of `variables` those that cannot be pickled; returns them as
    [{name, type, why}]."""
    skipped = []
    for name, value in list(variables.items()):
        try:
            StatePickler(Discard()).dump(value)
        except Exception as exc:
            del variables[name]
            if len(skipped) < MAX_SKIPPED:
                skipped.append({'name': name, 'type': type(value).__name__,
                                'why': ('%s: %s' % (type(exc).__name__, exc))[:200]})
    return skipped


def write_files(out) -> None:
    with tarfile.open(fileobj=out, mode='w', format=tarfile.PAX_FORMAT) as archive:
        for directory in SAVED_DIRECTORIES:
            if not os.path.isdir(directory):
                continue
            for entry in sorted(os.listdir(directory)):
                archive.add(os.path.join(directory, entry),
                            arcname=os.path.join(directory, entry).lstrip('/'))


def write_state(fd: int) -> dict:
    """Writes the state to fd in four parts: a header, the contexts and histories, the variables
    (pickled together, so that shared objects stay shared), the files; returns what the result
    reports, with `used`, the bytes written. The fd is a memfd the host sized (sparse) to the
    most the state may take: written through a mapping, since the sandbox's file size limit
    holds for write() and ftruncate(), not for a mapping of a file already that long."""
    try:
        capacity = os.fstat(fd).st_size
        out = mmap.mmap(fd, capacity) if capacity else None
    finally:
        os.close(fd)
    if out is None:
        raise SaveError('the host gave no room for the state')
    try:
        with out:
            return write_parts(out)
    except ValueError as exc:
        if not out_of_room(exc):
            raise
        raise SaveError('the state is larger than the %d bytes this session may save (its '
                        'memory limit)' % capacity) from None


def out_of_room(exc: BaseException) -> bool:
    return isinstance(exc, ValueError) and 'out of range' in str(exc)  # the mapping is full


def write_parts(out) -> dict:
    header = {'format': SAVE_FORMAT, 'python': sys.hexversion, 'cwd': os.getcwd()}
    write_part(out, lambda f: pickle.dump(header, f))
    tables = {'contexts': SESSION.contexts, 'histories': SESSION.histories}
    write_part(out, lambda f: StatePickler(f).dump(tables))
    variables, skipped, start = saved_variables(), [], out.tell()
    try:
        write_part(out, lambda f: StatePickler(f).dump(variables))
    except Exception as exc:
        if out_of_room(exc):
            raise
        out.seek(start)
        skipped = unpicklable(variables)
        try:
            write_part(out, lambda f: StatePickler(f).dump(variables))
        except Exception as again:  # each alone pickles, together not
            if out_of_room(again):
                raise
            raise SaveError('the variables cannot be saved together (%s)' % again) from None
    write_part(out, write_files)
    return {'skipped': skipped, 'used': out.tell()}


def read_parts(fd: int, start: int) -> tuple:
    """(header, tables, variables, files) of the state in fd from byte `start` on (a save file's
    header line is before it when the host passes the file itself); the files as a tarfile."""
    source = open(fd, 'rb', closefd=True)
    try:
        size = os.fstat(fd).st_size
        source.seek(start)
        parts = []
        for index in range(4):
            length = int.from_bytes(source.read(8), 'little')
            end = source.tell() + length
            if end > size or source.tell() > size:
                raise SaveError('the saved state is cut short')
            if index == 0:
                parts.append(pickle.Unpickler(source).load())
                check_header(parts[0])  # before anything of another Python is read
            elif index < 3:
                parts.append(StateUnpickler(source).load())
            else:
                parts.append(tarfile.open(fileobj=source, mode='r'))
            source.seek(end)
        return source, parts
    except BaseException:
        source.close()
        raise


def check_header(header) -> None:
    if not isinstance(header, dict) or header.get('format') != SAVE_FORMAT:
        raise SaveError('the saved state is of another format')
    if header.get('python') != sys.hexversion:
        raise SaveError('the state was saved by Python %s; this sandbox runs %s' %
                        (python_version(header.get('python')), python_version(sys.hexversion)))


def clear_saved_directories(keep: str = '') -> None:
    for directory in SAVED_DIRECTORIES:
        if not os.path.isdir(directory):
            continue
        for entry in os.listdir(directory):
            path = os.path.join(directory, entry)
            if path == keep:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def checked_members(archive) -> list:
    """The archive's members, as a save writes them: each under a saved directory, no '..', and
    none below a symlink of the archive's (a member through one would be written wherever the
    link points)."""
    members, links = archive.getmembers(), set()
    for member in members:
        parts = member.name.split('/')
        if not any(member.name.startswith(directory.lstrip('/') + '/')
                   for directory in SAVED_DIRECTORIES) or '..' in parts or \
                any('/'.join(parts[:end]) in links for end in range(1, len(parts))):
            raise SaveError('the saved files name %r' % member.name[:200])
        if member.issym():
            links.add(member.name.rstrip('/'))
    return members


def staged_files(archive, members) -> str:
    """The saved files extracted into a new directory in /tmp (its own tmpfs): a directory that
    holds tmp/... as the archive names them. SaveError when they cannot all be written; nothing
    else is touched then."""
    staging = tempfile.mkdtemp(prefix='.rlm-load-', dir='/tmp')
    try:
        if hasattr(tarfile, 'fully_trusted_filter'):
            archive.extractall(staging, members, filter='fully_trusted')
        else:
            archive.extractall(staging, members)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise SaveError('the saved files cannot be written (%s: %s)'
                        % (type(exc).__name__, exc)) from None
    return staging


def load_state(fd: int, start: int) -> None:
    """Replaces this session's variables, contexts, histories, files under /tmp and cwd with the
    saved ones. Everything is read, checked and the files written aside first; only then is the
    state replaced."""
    source, (header, tables, loaded, archive) = read_parts(fd, start)
    with source, archive:
        if not isinstance(loaded, dict) or not isinstance(tables, dict) or \
                not all(isinstance(tables.get(key), dict) for key in ('contexts', 'histories')):
            raise SaveError('the saved state is not of the shape a save writes')
        if not all(isinstance(index, int) and index >= 0
                   for key in ('contexts', 'histories') for index in tables[key]):
            raise SaveError('the saved state is not of the shape a save writes')
        members = checked_members(archive)
        staging = staged_files(archive, members) if members else ''
    try:
        replace_state(header, tables, loaded, staging)
    except BaseException as exc:
        # Half replaced: this interpreter ends, and the session rolls back to its state
        # before the load (status crashed).
        print('the load failed halfway: %s: %s' % (type(exc).__name__, exc), file=sys.stderr)
        os._exit(EXIT_LOAD_FAILED)


EXIT_LOAD_FAILED = 86


def replace_state(header, tables, loaded, staging: str) -> None:
    for name in list(SESSION.namespace):
        if not name.startswith('__'):
            del SESSION.namespace[name]
    SESSION.namespace.update(SESSION.scaffold)
    SESSION.contexts, SESSION.histories = {}, {}
    for kind, table in (('context', tables['contexts']), ('history', tables['histories'])):
        for index, value in sorted(table.items()):
            set_context(kind, index, value)
    SESSION.namespace.update(loaded)
    restore_scaffold()
    clear_saved_directories(keep=staging)
    if staging:
        staged = os.path.join(staging, 'tmp')
        if os.path.isdir(staged):
            for entry in os.listdir(staged):
                os.rename(os.path.join(staged, entry), os.path.join('/tmp', entry))
        shutil.rmtree(staging, ignore_errors=True)
    try:
        os.chdir(header.get('cwd') or '/')
    except OSError:
        pass


def python_version(hexversion) -> str:
    if not isinstance(hexversion, int):
        return 'an unknown version'
    return '%d.%d.%d' % (hexversion >> 24, (hexversion >> 16) & 0xff, (hexversion >> 8) & 0xff)


def run_state_op(op: HostFrame) -> dict:
    """The save or load op: a cell's result, with `saved` ({skipped}) for a save, or status
    error and the reason."""
    if not is_op_id(op.get('id')):
        protocol_violation('%s needs an id' % op.get('op'))
    start = op.get('offset', 0)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        protocol_violation('load offset must be a non-negative integer')
    fd = op.take_fd()
    if fd is None:
        protocol_violation('%s without its fd' % op.get('op'))
    before = cpu_seconds()
    result = {'type': 'cell_result', 'id': op.get('id'), 'status': 'ok', 'stdout': '',
              'stderr': '', 'stdout_truncated': False, 'stderr_truncated': False,
              'error': None}
    try:
        if op.get('op') == 'save':
            result['saved'] = write_state(fd)
        else:
            load_state(fd, start)
    except Exception as exc:
        result['status'] = 'error'
        result['error'] = '%s: %s' % (type(exc).__name__, exc) if not \
            isinstance(exc, SaveError) else str(exc)
    result['cpu_ms'] = round((cpu_seconds() - before) * 1000, 3)
    gc.unfreeze()
    return result
