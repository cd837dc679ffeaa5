# The root: the payload process, a child subreaper that forks the first interpreter and then
# only reaps; and main(), the script's entry.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import os
import signal
import traceback
import warnings


def become_subreaper() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        if libc.prctl(ctypes.c_int(pr_set_child_subreaper), ctypes.c_ulong(1),
                      ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (ImportError, OSError, AttributeError) as exc:
        # Orphans then go to the sandbox's init instead; rollback cannot find them.
        diag('cannot become a child subreaper (%s): a rollback may leave processes behind' % exc)


def scrub_environment() -> None:
    """Removes RLM_SANDBOX_* from os.environ, and blanks the token in the process's original
    environment block too, which /proc/self/environ would otherwise show every cell."""
    prefix = b'RLM_SANDBOX_TOKEN='
    try:
        import ctypes
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), 'environ')
        i = 0
        while environ[i]:
            entry = ctypes.string_at(environ[i])
            if entry.startswith(prefix):
                ctypes.memset(environ[i] + len(prefix), 0, len(entry) - len(prefix))
            i += 1
    except (ImportError, OSError, AttributeError, ValueError):
        pass  # os.environ below still hides it from os.environ and subprocesses
    for name in [n for n in os.environ if n.startswith('RLM_SANDBOX_')]:
        del os.environ[name]


def reap_until_alone(first_pid: int) -> int:
    """The root's exit status: the first interpreter's exit code when it failed (start-up or
    protocol error; it never runs cells itself), else 0."""
    status_of_first = None
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == first_pid:
            status_of_first = status
    if status_of_first is not None and os.WIFEXITED(status_of_first):
        return os.WEXITSTATUS(status_of_first)
    return 0


def main() -> None:
    global DIAG_FD, ROOT_PID
    # Python 3.12+ warns about forking a threaded process; forking is the design here.
    warnings.filterwarnings('ignore', category=DeprecationWarning, message='.*fork')
    try:
        DIAG_FD = os.dup(2)
    except OSError:
        DIAG_FD = -1
    try:
        config = Config()
    except StartupError as exc:
        die(str(exc), EXIT_STARTUP)
    scrub_environment()
    # After the scrub: code in the environment's .pth files never sees the token.
    add_site_dirs(config.site_dirs)
    become_subreaper()
    ROOT_PID = os.getpid()
    make_undumpable()  # inherited by every interpreter
    # The root shares a process group with the first interpreter (and, on the namespace backend,
    # with init) that no member anchors: a cell could orphan it with a stopped member of its own
    # in it, and the kernel would SIGHUP the whole group. Neither runs cells; each standby
    # restores the default before its cell (fork_standby).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    flush_std_streams()
    pid = os.fork()
    if pid == 0:
        try:
            first_interpreter(config)
        except BaseException as exc:  # a worker bug: say so, never fall back into the root
            die('worker failure: %s' % ''.join(traceback.format_exception(
                type(exc), exc, exc.__traceback__)), EXIT_STARTUP)
        os._exit(0)
    try:
        os.close(config.fd)
    except OSError:
        pass
    os._exit(reap_until_alone(pid))


if __name__ == '__main__':
    main()
