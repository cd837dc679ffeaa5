# Start-up: the environment read into a Config (and the site dirs it names), the first
# interpreter's hello, and the hand-over that gives the started worker (its first checkpoint and
# standby) its caller's context and options.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

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
        self.site_dirs = [d for d in os.environ.get('RLM_SANDBOX_SITE_DIRS', '').split(':') if d]
        for path in self.site_dirs:
            if not os.path.isabs(path):
                raise StartupError('RLM_SANDBOX_SITE_DIRS holds %r, not an absolute path' % path)


def env_int(name: str, default):
    value = os.environ.get(name)
    if value is None or value == '':
        return default
    try:
        return int(value)
    except ValueError:
        raise StartupError('%s=%r is not an integer' % (name, value)) from None


class Handover:
    """A caller's hand-over as received (docs/control-channel.md, "Start-up"): the caller's
    frame maximum, options, and context as an fd, read when the hand-over is applied."""

    def __init__(self, channel: Channel, op: HostFrame):
        self.id, self.format, max_frame = op.get('id'), op.get('context'), op.get('max_frame')
        self.options = op.get('options')
        if not is_op_id(self.id):
            protocol_violation('handover needs an id')
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or max_frame < 1024:
            protocol_violation('handover max_frame must be an integer of at least 1024')
        if self.format not in (None, 'text', 'json'):
            protocol_violation('handover context must be text, json or null')
        if SESSION.handed_over:
            protocol_violation('a second handover')
        self.fd = op.take_fd()
        if self.format is None and self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.format is not None and self.fd is None:
            protocol_violation('handover with a context and no fd')
        channel.max_frame = max_frame
        SESSION.handed_over = True

    def apply(self) -> None:
        """Makes the context `context_0` and `context` (reading and closing its fd), and the
        options the session's. Raises StartupError for a context that cannot be read or
        parsed, or options the protocol does not allow."""
        echo, tools = True, []
        if self.options is not None:
            if not isinstance(self.options, dict):
                raise StartupError('handover options must be an object')
            echo, tools = self.options.get('echo', True), self.options.get('tools', [])
            if not isinstance(echo, bool):
                raise StartupError('handover option echo must be a boolean')
        try:
            add_tools(tools)
        except ValueError as exc:
            raise StartupError('handover option tools: %s' % exc) from None
        SESSION.echo = echo
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                set_context('context', 0, load_context(fd, self.format))
            except ContextError as exc:
                raise StartupError(str(exc)) from None


def hand_over_standby(channel: Channel, op: HostFrame) -> None:
    """The first standby, waiting since start-up, takes its caller's context and answers."""
    handover = Handover(channel, op)
    reply = {'type': 'handed_over', 'id': handover.id}
    try:
        handover.apply()
    except StartupError as exc:
        reply['error'] = str(exc)
    channel.send(reply)


def hand_over_checkpoint(channel: Channel, op: HostFrame) -> None:
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


def add_site_dirs(dirs) -> None:
    """The directories of the Python environment the policy exposes (RLM_SANDBOX_SITE_DIRS) on
    sys.path, their .pth files processed, as `site` would (the worker runs with -S)."""
    if not dirs:
        return
    import site
    for path in dirs:
        site.addsitedir(path)


def first_interpreter(config: Config) -> None:
    """Everything a caller does not choose is done before hello (imports, compiles, the channel)
    and right after it (the first checkpoint and its standby, warmed up); then the worker waits
    for the hand-over, as long as it takes."""
    raise_oom_score()
    os.set_inheritable(config.fd, False)  # cells' subprocesses must not get the channel
    channel = Channel(socket.socket(fileno=config.fd), config.max_frame)
    SESSION.channel = channel
    make_namespace()
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
