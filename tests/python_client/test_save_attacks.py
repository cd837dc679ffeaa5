"""Attacks on save, load and fork (docs/sessions.md, "Save and restore" and "Fork"): from inside
cells (the worker's own functions are reachable as ``llm_query.__globals__`` and a save or load
runs in the next standby, which inherits what a cell changed there), with forged save files
(a header line with the right digests over a hostile body), through a server with hostile fds,
and between the branches of a fork. The bar: the host never blocks on a sandbox nor trusts its
sizes, a file does no more than a cell could, and a tenant reaches nothing of another's.

Each once succeeded (the host held memory a sandbox chose; a failed load's /tmp; files extracted
outside /tmp; a file larger than the session's room copied) and holds since its fix.

Run: ``RLM_SANDBOX_BIN=build/bin/rlm-sandbox python3 -m unittest -v test_save_attacks`` from
tests/python_client (ctest's ``python_save_attacks`` test does this).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import unittest
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from rlm_sandbox import RlmSandbox, RlmSandboxError, Server  # noqa: E402
from test_rlm_sandbox_client import BINARY, SandboxTestCase  # noqa: E402
from test_server_client import _stop, _wait_for_socket  # noqa: E402

MIB = 1 << 20
#: The sessions' limits in these tests: the room a save gets is the memory limit.
MEMORY = 96 * MIB
OPTIONS: Dict[str, Any] = {"memory": MEMORY, "timeout": 5}


def setUpModule() -> None:  # noqa: N802 - unittest's name
    if not BINARY:
        raise unittest.SkipTest("set RLM_SANDBOX_BIN to the build's bin/rlm-sandbox")


class Call:
    """Pickles as fn(*args): how a forged file runs code when the sandbox unpickles it."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return self.fn, self.args


def part(data: bytes) -> bytes:
    """One part of a state as the worker writes it: its length (8 bytes, little-endian), then it."""
    return len(data).to_bytes(8, "little") + data


def tar_of(members: List[Tuple[Dict[str, Any], Optional[bytes]]]) -> bytes:
    """A tar of (TarInfo fields with 'name', data or None) members, in that order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for fields, data in members:
            fields = dict(fields)
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            if data is None:
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def state_body(hexversion: int, variables: Any = None, tar: Optional[bytes] = None,
               variables_pickle: Optional[bytes] = None) -> bytes:
    """A state in the worker's four parts (header, tables, variables, files)."""
    header = pickle.dumps({"format": 1, "python": hexversion, "cwd": "/tmp"})
    tables = pickle.dumps({"contexts": {}, "histories": {}})
    if variables_pickle is None:
        variables_pickle = pickle.dumps(variables if variables is not None else {})
    return (part(header) + part(tables) + part(variables_pickle) +
            part(tar if tar is not None else tar_of([])))


class ForgedFiles:
    """Save files of the test's sessions (OPTIONS), forged: a genuine save gives the header's
    worker and policy digests, and each forged file's bytes and sha256 are computed anew."""

    def __init__(self, test: SandboxTestCase, directory: str) -> None:
        self.directory = directory
        genuine = test.sandbox(**OPTIONS)
        self.hexversion = int(test.run_ok(genuine, "import sys; print(sys.hexversion)").stdout)
        path = os.path.join(directory, "genuine.save")
        test.assertEqual(genuine.save(path).status, "ok")
        with open(path, "rb") as saved:
            self.identity = json.loads(saved.readline())

    def header(self, body_hash: str, size: int, **fields: Any) -> bytes:
        header = dict(self.identity, bytes=size, sha256=body_hash)
        header.update(fields)
        return json.dumps(header).encode() + b"\n"

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.directory, name)
        with open(path, "wb") as out:
            out.write(data)
        return path

    def file(self, name: str, body: bytes, padding: int = 0, **fields: Any) -> str:
        """A forged file of `body` and `padding` zero bytes after it (sparse on disk; the
        worker ignores bytes after its four parts), its header's sha256 right."""
        digest = hashlib.sha256(body)
        zeros = bytes(min(padding, 16 * MIB))
        left = padding
        while left:
            chunk = min(left, len(zeros))
            digest.update(zeros[:chunk])
            left -= chunk
        path = self.write(name, self.header(digest.hexdigest(), len(body) + padding, **fields) +
                          body)
        with open(path, "r+b") as out:
            out.truncate(os.path.getsize(path) + padding)
        return path

    def state(self, name: str, variables: Any = None, tar: Optional[bytes] = None,
              padding: int = 0) -> str:
        return self.file(name, state_body(self.hexversion, variables, tar), padding)


#: Run in a cell: a background process of the sandbox that keeps every fd sent to it (an
#: abstract unix socket) and reports the bytes their files hold (st_blocks), i.e. the memory
#: those fds keep alive; `keep(fd)` sends it one; the worker's functions stay reachable as W.
KEEPER_CELL = textwrap.dedent("""\
    import os, socket
    W = llm_query.__globals__
    listening = socket.socket(socket.AF_UNIX)
    listening.bind('\\0rlm-test-keeper')
    listening.listen()
    if os.fork() == 0:
        os.setsid()
        kept = []
        try:
            while True:
                conn, _ = listening.accept()
                message, fds, _, _ = socket.recv_fds(conn, 16, 4)
                kept += fds
                if message == b'report':
                    conn.sendall(str(sum(os.fstat(fd).st_blocks * 512 for fd in kept)).encode())
                conn.close()
                if message == b'stop':
                    break
        finally:
            os._exit(0)
    listening.close()
    def keep(fd, socket=socket):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect('\\0rlm-test-keeper')
            socket.send_fds(conn, [b'keep'], [fd])
    """)
#: A cell printing the bytes the keeper's fds hold.
KEPT_BYTES_CELL = textwrap.dedent("""\
    import socket
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect('\\0rlm-test-keeper')
        conn.sendall(b'report')
        print(conn.recv(64).decode())
    """)
STOP_KEEPER_CELL = textwrap.dedent("""\
    import socket
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect('\\0rlm-test-keeper')
        conn.sendall(b'stop')
    """)


class HostileCellSaveTest(SandboxTestCase):
    """A cell replaces the worker's write_state: the next save (run by a standby forked from
    that cell's interpreter) answers what the cell chose."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlm-save-attacks-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "out.save")

    def patched(self, write_state: str, **options: Any) -> RlmSandbox:
        """A sandbox holding keep = 42 whose worker's write_state is `write_state` (source
        defining `evil(fd)`)."""
        sb = self.sandbox(**options)
        self.run_ok(sb, "keep = 42")
        self.run_ok(sb, "import os, time, mmap\nW = llm_query.__globals__\n" +
                    textwrap.dedent(write_state) + "\nW['write_state'] = evil")
        return sb

    def test_a_hostile_used_ends_only_that_session(self) -> None:
        bystander = self.sandbox()
        self.run_ok(bystander, "b = 1")
        for used in ("-1", "1 << 62", "os.fstat(fd).st_size + 1", "1.5", "'10'", "True", "None"):
            with self.subTest(used=used):
                sb = self.patched(f"""\
                    def evil(fd):
                        answer = {{'skipped': [], 'used': {used}}}
                        os.close(fd)
                        return answer
                    """)
                with self.assertRaisesRegex(RlmSandboxError, "did not say how much"):
                    sb.save(self.path)
                self.assertFalse(os.path.exists(self.path))
                self.assertEqual(self.run_ok(bystander, "print(b)").stdout, "1\n")

    def test_a_mapping_kept_for_writing_fails_the_save_and_the_session_goes_on(self) -> None:
        # A child keeps writing through a shared mapping of the memfd after the worker answers:
        # the host's F_SEAL_WRITE is refused (EBUSY) and nothing is written.
        sb = self.patched("""\
            def evil(fd, original=W['write_state']):
                size = os.fstat(fd).st_size
                if os.fork() == 0:
                    mapping = mmap.mmap(fd, size)
                    end = time.time() + 5
                    while time.time() < end:
                        mapping[0:4] = b'EVIL'
                    os._exit(0)
                time.sleep(0.2)
                return original(fd)
            """)
        with self.assertRaisesRegex(RlmSandboxError, "still maps the saved state for writing"):
            sb.save(self.path)
        self.assertFalse(os.path.exists(self.path))
        self.assertEqual(self.run_ok(sb, "print(keep)").stdout, "42\n")
        self.run_ok(sb, "W['write_state'] = evil.__defaults__[0]")
        self.assertEqual(sb.save(self.path).status, "ok")

    def test_a_save_that_never_answers_or_fills_memory_ends_at_the_cells_limits(self) -> None:
        for evil, status in (("time.sleep(10 ** 6)", "timeout"),
                             ("os.kill(os.getpid(), 19)", "timeout"),  # SIGSTOP
                             ("[bytearray(1 << 20) for _ in range(10 ** 6)]", "memory_limit")):
            with self.subTest(evil=evil):
                sb = self.patched(f"def evil(fd):\n    {evil}", timeout=2, memory=MEMORY)
                result = sb.save(self.path)
                self.assertEqual(result.status, status, result)
                self.assertTrue(result.rolled_back)
                self.assertFalse(os.path.exists(self.path))
                self.assertEqual(self.run_ok(sb, "print(keep)").stdout, "42\n")

    def test_memory_a_sandbox_keeps_after_its_saves_stays_within_its_limit(self) -> None:
        # The worker writes nothing and answers used = its whole room (the memory limit), and
        # a background process of the sandbox keeps the memfd. Once, the host read it through a
        # mapping (each hole a page of the host's) and left it full: 2 saves of a 96M session
        # held 192 MiB of the host's memory until the session ended. Now it reads with pread (a
        # hole reads as zeros without a page) and empties the memfd once the save is written.
        sb = self.sandbox(**OPTIONS)
        self.run_ok(sb, KEEPER_CELL)
        self.run_ok(sb, textwrap.dedent("""\
            def evil(fd, keep=keep, os=os):
                keep(fd)
                size = os.fstat(fd).st_size
                os.close(fd)
                return {'skipped': [], 'used': size}
            W['write_state'] = evil
            """))
        self.addCleanup(sb.execute, STOP_KEEPER_CELL)
        for _ in range(2):
            sb.save(self.path)  # ok today (a file of 96 MiB of zeros); refused with a fix
        kept = int(self.run_ok(sb, KEPT_BYTES_CELL).stdout)
        self.assertLessEqual(kept, MEMORY, f"{kept >> 20} MiB kept alive by a 96M session")


class ForgedFileTest(SandboxTestCase):
    """Save files forged with a correct header over a hostile body, loaded into sessions of the
    same policy and limits (OPTIONS)."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlm-save-attacks-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.forged = ForgedFiles(self, self.dir)

    def session(self) -> RlmSandbox:
        sb = self.sandbox(**OPTIONS)
        self.run_ok(sb, "keep = 42\nopen('/tmp/before', 'w').write('before')")
        return sb

    def assertGoesOn(self, sb: RlmSandbox) -> None:  # noqa: N802 - unittest's style
        self.assertEqual(self.run_ok(sb, "print(keep)").stdout, "42\n")

    def test_code_a_file_runs_at_load_runs_inside_the_sandbox(self) -> None:
        probe = textwrap.dedent(f"""\
            import os, socket
            pids = [p for p in os.listdir('/proc') if p.isdigit()]
            seen = {{'pids': len(pids),
                     'host_process': any(b'unittest' in open('/proc/%s/cmdline' % p, 'rb').read()
                                         for p in pids),
                     'this_file': os.path.exists({os.path.abspath(__file__)!r}),
                     'host_dir': os.path.exists({self.dir!r}),
                     'uid': os.getuid()}}
            try:
                socket.create_connection(('1.1.1.1', 80), timeout=1)
                seen['network'] = True
            except OSError:
                seen['network'] = False
            """)
        path = self.forged.state("code.save", {
            "seen": Call(eval, "exec(PROBE, g := {}) or g['seen']", {"PROBE": probe})})
        sb = self.session()
        self.assertEqual(sb.load(path).status, "ok")
        seen = json.loads(self.run_ok(sb, "import json; print(json.dumps(seen))").stdout)
        self.assertFalse(seen["this_file"] or seen["host_dir"] or seen["network"] or
                         seen["host_process"], seen)
        self.assertLess(seen["pids"], 10, seen)  # its own few processes only

    def test_hostile_headers_are_refused_before_the_sandbox_reads_a_byte(self) -> None:
        body = state_body(self.forged.hexversion, {"loaded": 1})
        digest = hashlib.sha256(body).hexdigest()
        header = self.forged.header

        def line(**fields: Any) -> bytes:
            return header(digest, len(body), **fields)

        cases = {
            "bytes above 4 GiB": line(bytes=(4 << 30) + 1) + body,
            "bytes 2^64": line().replace(b'"bytes": %d' % len(body),
                                         b'"bytes": 18446744073709551616') + body,
            "bytes negative": line(bytes=-1) + body,
            "bytes a float": line(bytes=float(len(body))) + body,
            "bytes a string": line(bytes=str(len(body))) + body,
            "bytes one more": line(bytes=len(body) + 1) + body,
            "bytes one fewer": line(bytes=len(body) - 1) + body,
            "no newline": line().rstrip(b"\n"),
            "newline after 4 KiB": line(policy_name="p" * 5000) + body,
            "not UTF-8": line(policy_name="X").replace(b'"X"', b'"\xff\xfe"') + body,
            "nested 2000 deep": b"[" * 2000 + b"]" * 2000 + b"\n" + body,
            "duplicate sha256, the last wrong": line()[:-2] + b', "sha256": "00"}\n' + body,
            "another policy": line(policy="0" * 64) + body,
            "another worker": line(worker="0" * 64) + body,
            "worker not a string": line(worker=1) + body,
            "version 2": line(version=2) + body,
            "an array": b"[]\n" + body,
            "empty": b"",
            "a NUL in the line": line()[:10] + b"\0" + line()[10:] + body,
            "sha256 in capitals": line(sha256=digest.upper()) + body,
        }
        sb = self.session()
        for name, data in cases.items():
            with self.subTest(name):
                with self.assertRaises(RlmSandboxError):
                    sb.load(self.forged.write("header.save", data))
                self.assertGoesOn(sb)

    def test_names_outside_tmp_are_refused(self) -> None:
        sb = self.session()
        for name in ("/tmp/absolute", "/etc/evil", "tmp/../etc/evil", "tmp//../x", "etc/evil",
                     "tmp"):
            with self.subTest(name):
                path = self.forged.state("names.save", {"loaded": 1},
                                         tar_of([({"name": name}, b"x")]))
                result = sb.load(path)
                self.assertEqual(result.status, "error", result)
                self.assertIn("the saved files name", result.error)
                self.assertGoesOn(sb)
                self.assertEqual(self.run_ok(sb, "print(open('/tmp/before').read())").stdout,
                                 "before\n")

    def test_a_file_exhausting_the_sandbox_ends_like_such_a_cell(self) -> None:
        cases = {
            "memory": (Call(eval, "[bytearray(1 << 20) for _ in range(10 ** 5)]"),
                       "memory_limit"),
            "time": (Call(eval, "__import__('time').sleep(10 ** 6)"), "timeout"),
            "exit": (Call(os._exit, 0), "crashed"),
        }
        for name, (value, status) in cases.items():
            with self.subTest(name):
                sb = self.session()
                result = sb.load(self.forged.state("exhausting.save", {"value": value}))
                self.assertEqual(result.status, status, result)
                self.assertTrue(result.rolled_back)
                self.assertGoesOn(sb)

    def test_a_file_larger_than_the_sessions_room_is_refused(self) -> None:
        # A genuine state never exceeds the room a save gets (min(memory limit, 4 GiB)); the
        # host once copied any file up to 4 GiB into memory of its own before the sandbox read
        # it (a server's tenant: 4 GiB per concurrent load). Refused above the room now.
        path = self.forged.state("large.save", {"loaded": 1}, padding=MEMORY + MIB)
        sb = self.session()
        with self.assertRaises(RlmSandboxError):
            sb.load(path)

    def test_memory_a_sandbox_keeps_after_its_loads_stays_within_its_limit(self) -> None:
        # A background process of the sandbox keeps the fd of each load's memfd (the host's
        # copy of the file, charged to the host): 3 loads of a 64 MiB file once held 192 MiB of
        # the host's memory until the session ended. The copy is sealed against writing and
        # growing but not shrinking, and emptied once the load ends.
        path = self.forged.state("pinned.save", {"loaded": 1}, padding=64 * MIB)
        sb = self.session()
        self.run_ok(sb, KEEPER_CELL)
        self.run_ok(sb, textwrap.dedent("""\
            def evil(fd, start, keep=keep, original=W['load_state']):
                keep(fd)
                return original(fd, start)
            W['load_state'] = evil
            """))
        self.addCleanup(sb.execute, STOP_KEEPER_CELL)
        for _ in range(3):
            sb.load(path)
        kept = int(self.run_ok(sb, KEPT_BYTES_CELL).stdout)
        self.assertLessEqual(kept, MEMORY, f"{kept >> 20} MiB kept alive by a 96M session")

    def test_a_load_whose_files_cannot_be_written_leaves_tmp_as_it_was(self) -> None:
        # The files are written aside first (a directory of /tmp's own tmpfs) and moved into
        # place only once all are out: a device node that cannot be made fails the load before
        # anything is replaced (status error), and /tmp and the variables are as they were.
        path = self.forged.state("fails.save", {"loaded": 1}, tar_of([
            ({"name": "tmp/first"}, b"first"),
            ({"name": "tmp/null", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3},
             None)]))
        sb = self.session()
        result = sb.load(path)
        self.assertEqual(result.status, "error", result)
        self.assertIn("cannot be written", result.error)
        self.assertGoesOn(sb)
        self.assertEqual(self.run_ok(sb, "import os; print(sorted(os.listdir('/tmp')))").stdout,
                         "['before']\n")

    def test_files_are_extracted_only_under_tmp(self) -> None:
        # A symlink member, then a member through it, once wrote outside /tmp (here /dev/shm).
        # A member below a symlink member is refused now (a save never writes one).
        path = self.forged.state("through.save", {"loaded": 1}, tar_of([
            ({"name": "tmp/link", "type": tarfile.SYMTYPE, "linkname": "/dev/shm"}, None),
            ({"name": "tmp/link/planted"}, b"outside /tmp")]))
        sb = self.session()
        sb.load(path)
        self.assertEqual(self.run_ok(
            sb, "import os; print(os.path.exists('/dev/shm/planted'))").stdout, "False\n")


class ServerFdTest(unittest.TestCase):
    """A server's save and load given fds that are no regular file (or not writable for a save):
    refused at once, the session goes on, and another client is served meanwhile."""

    server: Optional[subprocess.Popen] = None
    dir = ""
    socket_path = ""

    @classmethod
    def setUpClass(cls) -> None:  # noqa: N802 - unittest's name
        cls.dir = tempfile.mkdtemp(prefix="rlm-save-attacks-server-")
        os.chmod(cls.dir, 0o755)
        cls.socket_path = os.path.join(cls.dir, "server.sock")
        cls.server = subprocess.Popen(
            [BINARY, "serve", "--socket", cls.socket_path, "--pool", "default=0",
             "--session-pool", "python-repl=0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_for_socket(cls.socket_path, cls.server, 60)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:  # noqa: N802 - unittest's name
        _stop(cls.server)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def fds(self, op: str) -> Dict[str, Tuple[int, List[Any]]]:
        """name: (fd, what keeps it open), each refused for `op`."""
        made: Dict[str, Tuple[int, List[Any]]] = {}
        read_end, write_end = os.pipe()
        made["pipe never written or read"] = (read_end if op == "load" else write_end,
                                              [read_end, write_end])
        fifo = os.path.join(self.dir, "fifo")
        if not os.path.exists(fifo):
            os.mkfifo(fifo)
        made["fifo"] = (os.open(fifo, os.O_RDWR), [])
        one, other = socket.socketpair()
        made["socket"] = (one.fileno(), [one, other])
        made["directory"] = (os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY), [])
        made["procfs"] = (os.open("/proc/self/status", os.O_RDONLY), [])
        made["/dev/full"] = (os.open("/dev/full", os.O_WRONLY), [])
        made["O_PATH"] = (os.open(self.dir, os.O_PATH), [])
        made["eventfd"] = (os.eventfd(0), [])
        if op == "save":
            path = os.path.join(self.dir, "readonly.save")
            open(path, "wb").close()
            made["read-only file"] = (os.open(path, os.O_RDONLY), [])
        return made

    def test_refused_fds_never_hold_up_the_server(self) -> None:
        session = Server(self.socket_path).session("python-repl")
        self.addCleanup(session.close)
        session.execute("keep = 42")
        for op in ("load", "save"):
            for name, (fd, keep) in self.fds(op).items():
                with self.subTest(op=op, fd=name):
                    try:
                        done: Dict[str, Any] = {}

                        def request() -> None:
                            try:
                                done["reply"] = session._request({"op": op}, "cell_result",
                                                                 fds=[fd])
                            except Exception as error:  # noqa: BLE001 - the expected refusal
                                done["error"] = error

                        thread = threading.Thread(target=request, daemon=True)
                        thread.start()
                        thread.join(20)
                        self.assertFalse(thread.is_alive(), "the server is blocked on the fd")
                        self.assertIn("error", done, done)
                        other = Server(self.socket_path).session("python-repl")
                        try:
                            self.assertEqual(other.execute("print(1)").stdout, "1\n")
                        finally:
                            other.close()
                        self.assertEqual(session.execute("print(keep)").stdout, "42\n")
                    finally:
                        if not keep:
                            os.close(fd)
                        for item in keep:
                            item.close() if hasattr(item, "close") else os.close(item)


class ForkIsolationTest(SandboxTestCase):
    """What ForkTest (tests/session/fork_test.cpp) does not try: a branch reaching the parent's
    or a sibling's abstract unix socket, SysV shared memory and message queue, POSIX shared
    memory (/dev/shm) and processes."""

    SETUP = textwrap.dedent("""\
        import ctypes, os, socket, subprocess
        listening = socket.socket(socket.AF_UNIX)
        listening.bind('\\0rlm-fork-' + TAG)
        listening.listen()
        libc = ctypes.CDLL(None, use_errno=True)
        key = 0x5EED00 + ['parent', 'b0', 'b1'].index(TAG)  # IPC_CREAT | 0666, a key each
        assert libc.shmget(key, 4096, 0o1666) >= 0 and libc.msgget(key, 0o1666) >= 0
        open('/dev/shm/fork-' + TAG, 'w').write(TAG)
        marker = subprocess.Popen(['sh', '-c', 'sleep 60', 'MARKER-' + TAG],
                                  start_new_session=True)
        print(marker.pid)
        """)
    PROBE = textwrap.dedent("""\
        import ctypes, os, socket, signal
        libc = ctypes.CDLL(None, use_errno=True)
        reached = []
        for tag in OTHERS:
            with socket.socket(socket.AF_UNIX) as conn:
                try:
                    conn.connect('\\0rlm-fork-' + tag)
                    reached.append('socket ' + tag)
                except OSError:
                    pass
            if os.path.exists('/dev/shm/fork-' + tag):
                reached.append('/dev/shm ' + tag)
        # Each session numbers its own pids: under another's marker pid this one may have a
        # process of its own (its checkpoint, say), which is no reach and must not be killed.
        for pid in PIDS:
            try:
                line = open('/proc/%d/cmdline' % pid, 'rb').read()
            except OSError:
                line = None  # none here by that number: the kill below must fail
            if line is not None and (b'MARKER-' + TAG.encode() in line or b'MARKER-' not in line):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                reached.append('killed %d' % pid)
            except OSError:
                pass
        for entry in os.listdir('/proc'):
            try:
                line = open('/proc/%s/cmdline' % entry, 'rb').read()
            except OSError:
                continue
            if b'MARKER-' in line and b'MARKER-' + TAG.encode() not in line:
                reached.append('sees ' + line.decode(errors='replace'))
        # Only its own SysV objects: one of each (its own key), none of the others'.
        for table in ('shm', 'msg'):
            rows = open('/proc/sysvipc/' + table).read().splitlines()[1:]
            if len(rows) != 1:
                reached.append('%s: %d objects' % (table, len(rows)))
        print(reached)
        """)

    def test_branches_reach_nothing_of_each_other_or_the_parent(self) -> None:
        parent = self.sandbox()
        pids = {"parent": int(self.run_ok(parent, "TAG = 'parent'\n" + self.SETUP).stdout)}
        branches = parent.fork(2)
        for branch in branches:
            self.addCleanup(self._dispose, branch)
        sessions = {"parent": parent, "b0": branches[0], "b1": branches[1]}
        for tag in ("b0", "b1"):
            pids[tag] = int(self.run_ok(sessions[tag], f"TAG = {tag!r}\n" + self.SETUP).stdout)
        for tag, session in sessions.items():
            others = [other for other in sessions if other != tag]
            reached = self.run_ok(session, f"TAG = {tag!r}\nOTHERS = {others!r}\n"
                                           f"PIDS = {list(pids.values())!r}\n" + self.PROBE)
            self.assertEqual(reached.stdout, "[]\n", tag)
        for session in sessions.values():
            self.run_ok(session, "marker.kill()")


if __name__ == "__main__":
    unittest.main()
