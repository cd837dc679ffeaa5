# Start-up: the environment read into a Config, the context loaded, the first interpreter's
# hello.
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
        self.context_fd = env_int('RLM_SANDBOX_CONTEXT_FD', None)
        context_file = os.environ.get('RLM_SANDBOX_CONTEXT_FILE')
        if self.context_fd is None and context_file:
            try:
                self.context_fd = os.open(context_file, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise StartupError('cannot open RLM_SANDBOX_CONTEXT_FILE=%s (%s)'
                                   % (context_file, exc)) from None
        self.context_format = os.environ.get('RLM_SANDBOX_CONTEXT_FORMAT') or 'text'
        if self.context_format not in ('text', 'json'):
            raise StartupError('RLM_SANDBOX_CONTEXT_FORMAT must be text or json, not %r'
                               % self.context_format)


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


def load_context(config: Config):
    """(context, bytes read)."""
    if config.context_fd is None:
        return None, 0
    try:
        raw = read_all(config.context_fd)
        os.close(config.context_fd)
    except OSError as exc:
        raise StartupError('cannot read the context from fd %d (%s)' % (config.context_fd, exc))
    if config.context_format == 'text':
        return raw.decode('utf-8', 'replace'), len(raw)
    try:
        return json.loads(raw.decode('utf-8')), len(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StartupError('the context is not valid JSON (%s)' % exc) from None


def first_interpreter(config: Config, token: str) -> None:
    raise_oom_score()
    try:
        context, context_length = load_context(config)
    except StartupError as exc:
        die(str(exc), EXIT_STARTUP)
    os.set_inheritable(config.fd, False)  # cells' subprocesses must not get the channel
    channel = Channel(socket.socket(fileno=config.fd), config.max_frame)
    SESSION.channel = channel
    SESSION.namespace = make_namespace(context)
    try:
        # Line buffering keeps print() and subprocess output in order in a cell's stdout.
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    version = '%d.%d.%d' % sys.version_info[:3]
    channel.send({'type': 'hello', 'token': token, 'pid': os.getpid(), 'python': version,
                  'context_length': context_length})
    serve(become_checkpoint(channel, 0))
