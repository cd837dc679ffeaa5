# Generations: the checkpoint and the standby forked between cells, rollback, commit, restore
# (docs/control-channel.md, "Generations"), and the standby's loop.
# One part of the REPL worker (worker/python/README.md): the parts listed in parts.txt are
# concatenated, in that order, into the one script the sandbox runs; they share its globals.

import builtins
import gc
import json
import os
import signal
import socket
import sys
import time


def is_op_id(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def was_rolled_back(op_id) -> bool:
    return is_op_id(op_id) and op_id in SESSION.rolled_back


def raise_oom_score() -> None:
    """Makes the interpreters the OOM killer's first choice (every fork inherits the value). For
    the first interpreter, before any cell exists: a non-dumpable process's /proc files belong to
    root, so it is dumpable for the write."""
    try:
        LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        with open('/proc/self/oom_score_adj', 'w') as f:
            f.write('1000')
    except (OSError, AttributeError):
        pass
    make_undumpable()


PR_SET_DUMPABLE = 4
LIBC = None  # ctypes' libc, loaded once before any cell runs


def make_undumpable() -> None:
    """Keeps every other process of the sandbox (a cell runs as the same user) out of this one's
    memory: /proc/PID/mem, environ, fd and the like need ptrace access, which the kernel refuses
    for a non-dumpable process to anyone without CAP_SYS_PTRACE. Inherited by fork; set again
    before each fork, since a cell may have made its own process dumpable again."""
    global LIBC
    try:
        if LIBC is None:
            import ctypes
            LIBC = ctypes.CDLL(None, use_errno=True)
        if LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return
        error = 'prctl: errno %d' % __import__('ctypes').get_errno()
    except (ImportError, OSError, AttributeError) as exc:
        error = str(exc)
    die('cannot make the interpreter non-dumpable (%s): a cell could write into its '
        'checkpoint' % error, EXIT_STARTUP)


def fork_standby(channel: Channel, fork_id):
    """Forks a standby (docs/control-channel.md, "Forking a standby"). In the child returns its
    new Channel (the child is the standby now); in the parent sends the fork frame on the
    parent's channel and returns a ChildWatch (the parent is now the armed checkpoint)."""
    if SESSION.pending_handover is not None:
        apply_pending_handover()  # the standby must have the caller's context
    flush_std_streams()  # else buffered output would be written twice
    if SESSION.next_capture is not None:  # made by warm_up, but no cell ran here
        SESSION.next_capture.retire()
        SESSION.next_capture = None
    close_finished_captures()  # else the child would inherit their pipes
    make_undumpable()  # the cell that ran here may have undone it; both sides inherit it
    mine, theirs = socket.socketpair()
    # `random` reseeds itself in every forked child (os.register_at_fork): a standby is the
    # same state, so its generator goes on from where the checkpoint's is, as in one process.
    generator = sys.modules.get('random')
    try:
        generator_state = generator.getstate() if generator is not None else None
    except Exception:  # a cell replaced it with something else
        generator_state = None
    pid = os.fork()
    if pid == 0:
        if generator_state is not None:
            try:
                generator.setstate(generator_state)
            except Exception:
                pass
        mine.close()
        channel.close()  # else the child could speak for its checkpoint, and hide its EOF
        for watch in SESSION.watches:
            watch.close()  # the checkpoint's pidfds are its own
        SESSION.watches = []
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        # Cells (and what they exec) see SIGHUP as usual. This process's group is its own, and
        # anchored by it (its parent is in another group of the same session), so no cell can
        # orphan it once it is a checkpoint.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        child_channel = Channel(theirs, channel.max_frame)
        SESSION.channel = child_channel
        warm_up(child_channel)
        return child_channel
    # The fork frame first: with cells sent back to back the host is waiting for it. The child
    # is watched only from the next wait on, so nothing below may come before the frame.
    channel.send({'type': 'fork', 'id': fork_id, 'pid': pid}, fd=mine.fileno())
    mine.close()
    theirs.close()
    try:
        os.setpgid(pid, pid)  # also here, so the group exists before we could kill it
    except OSError:
        pass
    child = ChildWatch(pid)
    SESSION.watches.append(child)
    return child


# How long a fresh standby waits for an op before it warms up: the host sends the next execute
# as soon as it has the fork frame when cells come back to back.
WARM_UP_DELAY = 0.002


def warm_up(channel: Channel) -> None:
    """Readies a fresh standby while it waits, so the next cell does not pay for it: every
    page the fork shares with the checkpoint is copied on its first write, and a cell would
    otherwise take those faults for the REPL's own machinery (and the garbage collector's
    full-heap passes). The objects that exist now are frozen out of the collector until the
    cell ends (run_cell unfreezes them), the cell's output capture is made, and, unless the
    host's next op comes within WARM_UP_DELAY (cells sent back to back: warming would only
    delay it), one empty cell runs through the same path with nothing sent."""
    gc.freeze()
    SESSION.next_capture = OutputCapture()
    SESSION.op_came_at_once = channel.has_input(WARM_UP_DELAY)
    if SESSION.op_came_at_once:
        return
    scratch = {'__builtins__': builtins}
    capture = OutputCapture().activate(0)
    try:
        run_source('pass', scratch)
    finally:
        capture.finish()
        close_finished_captures()  # off the cell's path: no op came
    json.dumps({'type': 'cell_result', 'id': 0, 'status': 'ok', 'stdout': '', 'stderr': '',
                'error': None, 'cpu_ms': cpu_seconds()})


def roll_back(child: ChildWatch):
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(child.pid, signal.SIGKILL)
    except OSError:
        pass
    if child.start_time is not None:  # else no /proc: the process group is all we can do
        kill_started_after(child)
    return child.reap()


def forget(child: ChildWatch) -> None:
    child.close()
    SESSION.watches.remove(child)


def become_checkpoint(channel: Channel, fork_id) -> Channel:
    """Forks a standby and stays behind as the frozen checkpoint, armed. Returns only in a
    standby (the first one or one forked later by rollback or restore), with its channel;
    discard and EOF exit inside the channel without touching any child."""
    forked = fork_standby(channel, fork_id)
    while True:
        if isinstance(forked, Channel):
            return forked
        armed, forked = forked, None  # armed: the standby whose death means rollback
        while forked is None:
            event = channel.wait_frozen(SESSION.watches)
            if isinstance(event, ChildWatch):
                if event is armed:  # the standby died (OOM killer, segfault, os._exit)
                    forked = roll_back_and_refork(channel, armed, None)
                else:  # a former standby disarmed by commit: only reap it
                    event.reap()
                    forget(event)
                continue
            kind, op_id = event.get('op'), event.get('id')
            if kind == 'rollback':
                if armed is None or was_rolled_back(op_id):
                    continue  # crossed S's death (or a commit) we already acted on
                if not is_op_id(op_id):
                    protocol_violation('rollback needs an id')
                forked = roll_back_and_refork(channel, armed, op_id)
            elif kind == 'commit':
                armed = None  # a snapshot for good: the child lives on, only reaped
            elif kind == 'handover':
                hand_over_checkpoint(channel, event)
            elif kind == 'restore':
                if armed is not None:
                    protocol_violation('restore sent to an armed checkpoint (commit it first)')
                if not is_op_id(op_id):
                    protocol_violation('restore needs an id')
                forked = fork_standby(channel, op_id)
            else:
                protocol_violation('unexpected op %r for a frozen interpreter' % kind)


def roll_back_and_refork(channel: Channel, standby: ChildWatch, op_id):
    """Kills the standby and everything started after it, reports, forks a new standby."""
    try:
        exit_code, sig = roll_back(standby)
    finally:
        forget(standby)
    if op_id is not None:
        SESSION.rolled_back.add(op_id)
    channel.send({'type': 'rolled_back', 'id': op_id, 'exit_code': exit_code, 'signal': sig})
    return fork_standby(channel, op_id)


def execute_op(op: dict):
    """(code, output_cap, locals, fetch) of an execute op, or a protocol error."""
    code, cap = op.get('code'), op.get('output_cap', DEFAULT_OUTPUT_CAP)
    want_locals, fetch = op.get('locals', False), op.get('fetch')
    if not is_op_id(op.get('id')) or not isinstance(code, str):
        protocol_violation('execute needs an id and a code string')
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        protocol_violation('execute output_cap must be a non-negative integer')
    if not isinstance(want_locals, bool) or not (fetch is None or isinstance(fetch, str)):
        protocol_violation('execute locals must be a boolean and fetch a string')
    return code, cap, want_locals, fetch


def serve(channel: Channel) -> None:
    """The standby's loop: the cell runs here, in-process; then this process forks the next
    standby and becomes the checkpoint, and only the new standby comes back here. Each
    process leaves this loop only by exiting."""
    while True:
        op = channel.next_op()
        kind, op_id = op.get('op'), op.get('id')
        if kind == 'handover':
            hand_over_standby(channel, op)
            continue
        if kind == 'rollback' and was_rolled_back(op_id):
            continue  # stale: the rollback it crossed was already taken
        if kind not in ('execute', 'add_context', 'save', 'load'):
            protocol_violation('unexpected op %r for the standby' % kind)
        if not SESSION.handed_over:
            protocol_violation('%s before the handover' % kind)
        if kind == 'execute':
            fit_cell_result(channel, run_cell(channel, op_id, *execute_op(op)))
        elif kind == 'add_context':
            fit_cell_result(channel, run_add_context(op))
        else:
            fit_cell_result(channel, run_state_op(op))
        if not SESSION.op_came_at_once:
            # A caller that paused before this op is likely waiting on the result alone: the
            # fork (a page-table copy of the whole interpreter, then this standby's and the
            # next one's CPU) would keep it off a CPU for a scheduler slice, 1-2 ms on two
            # CPUs. With ops back to back the next cell waits for the fork instead.
            time.sleep(HANDOVER_PAUSE)
        channel = become_checkpoint(channel, op_id)
