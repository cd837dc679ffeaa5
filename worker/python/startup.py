# Start-up: the environment read into a Config, the first interpreter's hello, and the hand-over
# that gives the started worker (its first checkpoint and standby) its caller's context.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import errno
import json
import os
import socket
import stat
import sys

DEFAULT_MAX_FRAME = 16 * 1024 * 1024


class StartupError(Exception):
    pass


class Config:
    def __init__(self):
        self.fd = env_int('RLM_SANDBOX_FD', None)
        path = os.environ.get('RLM_SANDBOX_SOCKET')
        if self.fd is None and path:
            # The Docker backend: a socket the host listens on, in a bind-mounted directory.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError as exc:
                raise StartupError('cannot connect to RLM_SANDBOX_SOCKET=%s (%s)'
                                   % (path, exc)) from None
            self.fd = sock.detach()
        if self.fd is None:
            raise StartupError('neither RLM_SANDBOX_FD nor RLM_SANDBOX_SOCKET is set')
        try:
            mode = os.fstat(self.fd).st_mode
        except OSError as exc:
            raise StartupError('RLM_SANDBOX_FD=%d is not open (%s)' % (self.fd, exc)) from None
        if not stat.S_ISSOCK(mode):
            raise StartupError('RLM_SANDBOX_FD=%d is not a socket' % self.fd)
        self.token = os.environ.get('RLM_SANDBOX_TOKEN', '')
        if not self.token:
            raise StartupError('RLM_SANDBOX_TOKEN is not set')
        self.max_frame = env_int('RLM_SANDBOX_MAX_FRAME', DEFAULT_MAX_FRAME)
        if self.max_frame < 1024:
            raise StartupError('RLM_SANDBOX_MAX_FRAME must be at least 1024')


def env_int(name: str, default):
    value = os.environ.get(name)
    if value is None or value == '':
        return default
    try:
        return int(value)
    except ValueError:
        raise StartupError('%s=%r is not an integer' % (name, value)) from None


def read_all(fd: int) -> bytes:
    """From offset 0 when the fd can seek (a memfd the host wrote is left at its end)."""
    chunks, offset = [], 0
    try:
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
    """The context read from fd (closed then) as text or parsed JSON."""
    try:
        raw = read_all(fd)
    except OSError as exc:
        raise StartupError('cannot read the context (%s)' % exc) from None
    finally:
        os.close(fd)
    if context_format == 'text':
        return raw.decode('utf-8', 'replace')
    try:
        return json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StartupError('the context is not valid JSON (%s)' % exc) from None


class Handover:
    """A caller's hand-over as received (docs/control-channel.md, "Start-up"): the caller's
    frame maximum, and its context as an fd, read when the hand-over is applied."""

    def __init__(self, channel: Channel, op: dict):
        self.id, self.format, max_frame = op.get('id'), op.get('context'), op.get('max_frame')
        if not is_op_id(self.id):
            protocol_violation('handover needs an id')
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or max_frame < 1024:
            protocol_violation('handover max_frame must be an integer of at least 1024')
        if self.format not in (None, 'text', 'json'):
            protocol_violation('handover context must be text, json or null')
        if SESSION.handed_over:
            protocol_violation('a second handover')
        self.fd = channel.take_fd()
        if self.format is None and self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.format is not None and self.fd is None:
            protocol_violation('handover with a context and no fd')
        channel.max_frame = max_frame
        channel.takes_fds = False
        SESSION.handed_over = True

    def apply(self) -> None:
        """Makes the context the REPL's `context` (reading and closing its fd). Raises
        StartupError for one that cannot be read or parsed."""
        context = None
        if self.fd is not None:
            fd, self.fd = self.fd, None
            context = load_context(fd, self.format)
        SESSION.api['context'] = context
        SESSION.namespace['context'] = context


def hand_over_standby(channel: Channel, op: dict) -> None:
    """The first standby, waiting since start-up, takes its caller's context and answers."""
    handover = Handover(channel, op)
    reply = {'type': 'handed_over', 'id': handover.id}
    try:
        handover.apply()
    except StartupError as exc:
        reply['error'] = str(exc)
    channel.send(reply)


def hand_over_checkpoint(channel: Channel, op: dict) -> None:
    """The first checkpoint keeps the hand-over and applies it before it forks a standby (after
    a rollback or a restore): every standby it forks from then on has the caller's context, and
    the context is read here only when that happens."""
    SESSION.pending_handover = Handover(channel, op)


def apply_pending_handover() -> None:
    handover, SESSION.pending_handover = SESSION.pending_handover, None
    try:
        handover.apply()
    except StartupError as exc:
        die(str(exc), EXIT_STARTUP)


def first_interpreter(config: Config) -> None:
    """Everything a caller does not choose is done before hello (imports, compiles, the channel)
    and right after it (the first checkpoint and its standby, warmed up); then the worker waits
    for the hand-over, as long as it takes."""
    raise_oom_score()
    os.set_inheritable(config.fd, False)  # cells' subprocesses must not get the channel
    channel = Channel(socket.socket(fileno=config.fd), config.max_frame)
    channel.takes_fds = True  # the hand-over's context
    SESSION.channel = channel
    SESSION.namespace = make_namespace(None)
    try:
        # Line buffering keeps print() and subprocess output in order in a cell's stdout.
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    version = '%d.%d.%d' % sys.version_info[:3]
    channel.send({'type': 'hello', 'token': config.token, 'pid': os.getpid(),
                  'python': version})
    config.token = None  # the frames below this one stay on every cell's stack
    serve(become_checkpoint(channel, 0))
