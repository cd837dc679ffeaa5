# Contexts and histories that come as an fd (the hand-over's, add_context's): read, parsed, and
# made context_N / history_N by the add_context op, which the standby answers like a cell.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import errno
import gc
import json
import os
import stat


class ContextError(Exception):
    pass


def read_all(fd: int) -> bytes:
    """From offset 0 when the fd can seek (a memfd the host wrote is left at its end): a regular
    file or memfd in one pread of its size, so its bytes are copied once."""
    chunks, offset = [], 0
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_size > 0:
            data = os.pread(fd, info.st_size, 0)
            if len(data) == info.st_size:
                more = os.pread(fd, 1 << 20, len(data))
                if not more:
                    return data
                chunks, offset = [data, more], len(data) + len(more)  # it grew meanwhile
            else:
                chunks, offset = [data], len(data)
        while True:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                return b''.join(chunks)
            chunks.append(chunk)
            offset += len(chunk)
    except OSError as exc:
        if chunks or exc.errno != errno.ESPIPE:  # a pipe: read it in order
            raise
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b''.join(chunks)
        chunks.append(chunk)


def load_context(fd, context_format: str):
    """The context read from fd (closed then) as text or parsed JSON; ContextError for one that
    cannot be read or parsed."""
    try:
        raw = read_all(fd)
    except OSError as exc:
        raise ContextError('cannot read the context (%s)' % exc) from None
    finally:
        os.close(fd)
    if context_format == 'text':
        return raw.decode('utf-8', 'replace')
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ContextError('the context is not valid JSON (%s)' % exc) from None


def add_context_op(op: HostFrame):
    """(index, kind, format, fd) of an add_context op, or a protocol error."""
    index, kind, context_format = op.get('index'), op.get('kind'), op.get('format')
    if not is_op_id(op.get('id')):
        protocol_violation('add_context needs an id')
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or
                              index < 0):
        protocol_violation('add_context index must be a non-negative integer or null')
    if kind not in ('context', 'history') or context_format not in ('text', 'json'):
        protocol_violation('add_context needs a kind (context or history) and a format '
                           '(text or json)')
    fd = op.take_fd()
    if fd is None:
        protocol_violation('add_context without its fd')
    return index, kind, context_format, fd


def run_add_context(op: HostFrame) -> dict:
    """Reads the fd the op came with into context_N or history_N; the result is a cell's, with
    the index (or status error and the reason)."""
    index, kind, context_format, fd = add_context_op(op)
    before = cpu_seconds()
    result = {'type': 'cell_result', 'id': op.get('id'), 'status': 'ok', 'stdout': '',
              'stderr': '', 'stdout_truncated': False, 'stderr_truncated': False,
              'error': None}
    try:
        result['index'] = set_context(kind, index, load_context(fd, context_format))
    except ContextError as exc:
        result['status'] = 'error'
        result['error'] = str(exc).replace('the context', 'the ' + kind, 1)
    result['cpu_ms'] = round((cpu_seconds() - before) * 1000, 3)
    gc.unfreeze()  # as after a cell: warm_up froze the state before it
    return result
