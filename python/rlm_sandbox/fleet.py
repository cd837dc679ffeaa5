"""A fleet: several ``rlm-sandbox serve`` nodes, and the placement of runs and sessions among them
done here, in the client (docs/fleet.md), as the C++ client's ``rlm::Fleet`` does it.

A request goes to the best of K nodes chosen at random, scored by the free room their
``capacity`` reports; a node that is full, draining, lacks a required backend or does not answer
is passed over, and so is one that refuses the request ``resource_exhausted``, ``draining`` or
``unavailable``; the request then goes back to the nodes left. A session stays on its node
(``ServerSession.node``); when that node dies, its calls fail with :class:`ServerError`
``node_lost``. Nothing is shared between clients or nodes: a session's id names its node.

The nodes come from a source (:func:`read_fleet`): a file of endpoints, a directory where nodes
register themselves, or ``slurm:PORT``, the TLS listeners on PORT of the Slurm job's nodes.
"""

from __future__ import annotations

import math
import os
import random
import stat
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

from ._slurm_hostlist import MAX_HOSTS, expand_slurm_hostlist
from ._tls_relay import TlsFiles, is_tls_endpoint, split_endpoint, tls_files
from ._wire import ServerError
from .result import RlmSandboxError, RunResult
from .server import Server, ServerSession

_MAX_ENDPOINTS = MAX_HOSTS
_MAX_ENDPOINT_BYTES = 4096
_SUFFIX = ".endpoint"
#: The capacity answer placement and status() take: one deadline for the connect and the whole
#: reply (default; Fleet's ask_timeout), and its size at most (a capacity is a few hundred bytes).
_ASK_TIMEOUT = 2.0
_MAX_CAPACITY_BYTES = 64 << 10
#: Warm sandboxes and sessions idle per count, as placement reads them (only a tie-break).
_MAX_WARM = 1000.0
_MALFORMED = "its capacity answer is malformed"
#: Refusals a node gives for itself (full, draining, not serving now, gone): the next node may
#: take the request. Any other kind (a policy not offered, a loosening) would be the same anywhere.
_PASSES_OVER = frozenset({"resource_exhausted", "draining", "unavailable"})

_T = TypeVar("_T")


def fleet_from_environment() -> Optional[str]:
    """The fleet source named by ``$RLM_SANDBOX_FLEET``, or None."""
    return os.environ.get("RLM_SANDBOX_FLEET") or None


def endpoint_socket(endpoint: str) -> str:
    """What :class:`Server` connects to for `endpoint`: the socket path of ``"unix:/run/a.sock"``
    or ``"/run/a.sock"``, or ``"tls://HOST:PORT"`` (``tls://[V6]:PORT``) itself, a server's TLS
    listener; ValueError for any other kind."""
    if is_tls_endpoint(endpoint):
        try:
            split_endpoint(endpoint)
        except ValueError:
            raise ValueError(f"endpoint '{endpoint}': expected tls://HOST:PORT") from None
        return endpoint
    path = endpoint[5:] if endpoint.startswith("unix:") else endpoint
    if "\0" in path:
        raise ValueError(f"endpoint {endpoint!r}: a NUL byte in the path")
    if not path.startswith("/"):
        raise ValueError(f"endpoint '{endpoint}': expected unix:/PATH or /PATH of a server's "
                         f"socket, or tls://HOST:PORT of its TLS listener")
    return path


def _trimmed(line: bytes) -> bytes:
    return line.strip(b" \t\r")


def _slurm_job_endpoints(source: str) -> List[str]:
    """``"slurm:PORT"``: the TLS listener on PORT of every host of the Slurm job this client runs
    in (the pilot's nodes, packaging/slurm), from ``$SLURM_JOB_NODELIST`` (``$SLURM_NODELIST``
    when that is unset), as the C++ client's read_fleet reads it."""
    port = source[len("slurm:"):]
    if not 0 < len(port) <= 5 or not all("0" <= c <= "9" for c in port) or \
            not 0 < int(port) <= 65535:
        raise RlmSandboxError(f"fleet {source}: expected slurm:PORT, the port of the nodes' TLS "
                              f"listeners")
    hosts = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not hosts:
        raise RlmSandboxError(f"fleet {source}: SLURM_JOB_NODELIST is not set (is this inside a "
                              f"Slurm job's allocation?)")
    try:
        return [f"tls://{host}:{port}" for host in expand_slurm_hostlist(hosts, _MAX_ENDPOINTS)]
    except RlmSandboxError as error:
        raise RlmSandboxError(f"fleet {source}: {error}") from None


def read_fleet(source: Union[str, os.PathLike]) -> List[str]:
    """A fleet's endpoints from `source`:

    - a directory: every regular file named ``*.endpoint`` in it (symlinks are not followed)
      holds one endpoint on its first line, what ``rlm-sandbox serve --register DIR`` writes (a
      node removes its file when it exits); read in the order of their names; an empty file
      (one being written) is skipped, and so is a bad one (a symlink, a FIFO or other
      non-regular file, one that cannot be read, one whose endpoint is malformed or of another
      kind): anyone who can write there must not break every placement;
    - a file: one endpoint per line; blank lines and ``#`` comments are skipped;
    - ``"slurm:PORT"``: ``tls://HOST:PORT`` for every host of the Slurm job this runs in
      (``$SLURM_JOB_NODELIST``, e.g. ``"node[01-03]"``, expanded as
      :func:`expand_slurm_hostlist` does), the TLS listeners the pilot's nodes open (a
      name, not a path: a file called ``slurm:...`` is read as ``./slurm:...``).

    An endpoint is ``unix:PATH`` or an absolute ``PATH`` of a server's socket, or
    ``tls://HOST:PORT`` (``tls://[V6]:PORT``) of a server's TLS listener.

    Raises:
        RlmSandboxError: the source cannot be read or holds no (good) endpoint; a file that
            names one of another kind (the message names the source and the line); a
            ``slurm:`` source with a bad port, outside a Slurm job, or with a malformed node
            list.
    """
    source = os.fsdecode(os.fspath(source))
    if source.startswith("slurm:"):  # before the stat: it names no file
        return _slurm_job_endpoints(source)
    endpoints: List[str] = []
    try:
        is_dir = stat.S_ISDIR(os.stat(source).st_mode)
    except (OSError, ValueError):
        raise RlmSandboxError(f"fleet {source}: no such file or directory") from None

    def checked(raw: bytes, where: str) -> str:
        raw = _trimmed(raw)
        if len(raw) > _MAX_ENDPOINT_BYTES:
            raise RlmSandboxError(f"{where}: an endpoint this long")
        endpoint = os.fsdecode(raw)
        try:
            endpoint_socket(endpoint)
        except ValueError as error:
            raise RlmSandboxError(f"{where}: {error}") from None
        return endpoint

    def add(endpoint: str) -> None:
        if len(endpoints) >= _MAX_ENDPOINTS:
            raise RlmSandboxError(f"fleet {source}: more than {_MAX_ENDPOINTS} nodes")
        endpoints.append(endpoint)

    if is_dir:
        try:
            names = os.listdir(source)
        except OSError:
            raise RlmSandboxError(f"fleet {source}: cannot read the directory") from None
        names = sorted((name for name in names
                        if len(name) > len(_SUFFIX) and name.endswith(_SUFFIX)), key=os.fsencode)
        for name in names:
            path = source + "/" + name
            line = _endpoint_file_line(path)
            if line is None or not _trimmed(line):
                continue  # not a regular file, unreadable, or empty (being written)
            try:
                endpoint = checked(line, f"fleet {path}")
            except RlmSandboxError:
                continue  # malformed, or of another kind: the other nodes still serve
            add(endpoint)
    else:
        try:
            with open(source, "rb") as file:
                data = file.read()
        except OSError:
            raise RlmSandboxError(f"fleet {source}: cannot read it") from None
        for number, line in enumerate(data.split(b"\n"), 1):
            line = line.split(b"#", 1)[0]
            if not _trimmed(line):
                continue
            add(checked(line, f"fleet {source} line {number}"))
    if not endpoints:
        raise RlmSandboxError(
            f"fleet {source}: no endpoints in it"
            + (" (no *.endpoint file: is a node registered there?)" if is_dir else ""))
    return endpoints


def _endpoint_file_line(path: str) -> Optional[bytes]:
    """The first line of the endpoint file at `path` (at most 4 KiB read), or None when it is
    no regular file (a symlink, a FIFO, a device, a directory), gone or unreadable, or its first
    line is longer than an endpoint can be."""
    try:
        # O_NOFOLLOW: a symlink is not followed; O_NONBLOCK: a FIFO does not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) < _MAX_ENDPOINT_BYTES:
            chunk = os.read(fd, _MAX_ENDPOINT_BYTES - len(data))
            if not chunk:
                break
            data += chunk
            if b"\n" in chunk:
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    if b"\n" not in data and len(data) >= _MAX_ENDPOINT_BYTES:
        return None  # longer than an endpoint can be
    return data.split(b"\n", 1)[0]


def _number(value: Any) -> float:
    """A number as the capacity gives it, else 0; ValueError for one that is not finite (the
    wire refuses NaN and Infinity; a dict handed to _room may hold them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    number = float(value)  # OverflowError for an integer past a float's range
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _warm(value: Any) -> float:
    """A count of warm sandboxes or sessions, clamped to 0..1000."""
    return min(max(_number(value), 0.0), _MAX_WARM)


def _count(value: Any) -> float:
    """A count as the capacity gives it: a non-negative integer, else 0; OverflowError for one
    past a float's range."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0.0
    return float(value)


def _room(capacity: Any, backends: Sequence[str]) -> Tuple[Optional[float], str]:
    """The room a node has by its capacity: free slots, or a large number less what it holds for
    a node with no cap of its own; (None, why) when it cannot take work (draining, full, lacking
    a backend) or its answer is malformed (not an object, a count no float holds, a room that
    is not a finite number). Never raises."""
    try:
        room, why = _room_of(capacity, backends)
    except Exception:  # noqa: BLE001 - whatever a node answers, it is only passed over
        return None, _MALFORMED
    if room is not None and not math.isfinite(room):
        return None, _MALFORMED
    return room, why


def _room_of(capacity: Any, backends: Sequence[str]) -> Tuple[Optional[float], str]:
    if not isinstance(capacity, dict):
        raise TypeError("the capacity is not an object")
    if capacity.get("draining") is True:
        return None, "draining"
    features = capacity.get("features")
    offered = features.get("backends") if isinstance(features, dict) else None
    offered = offered if isinstance(offered, list) else []
    for backend in backends:
        if backend not in offered:
            return None, f"has no {backend} backend"
    held = _count(capacity.get("running")) + _count(capacity.get("starting"))
    maximum = _count(capacity.get("max_sandboxes"))
    if maximum > 0 and held >= maximum:
        return None, f"full ({int(held)} of {int(maximum)})"
    # Warm sandboxes and sessions idle break ties: the request is served warm there.
    warm = 0.0
    pools = capacity.get("warm_idle")
    if isinstance(pools, dict):
        for pool in pools.values():
            if isinstance(pool, dict):
                warm += _warm(pool.get("sandboxes")) + _warm(pool.get("sessions"))
    free = maximum - held if maximum > 0 else 1e9 - held
    return free + min(warm, _MAX_WARM) / 1e4, ""


class Fleet:
    """Nodes of a fleet and the placement of work among them. One Fleet serves any number of
    threads: each placement and each request takes connections of its own.

    Args:
        fleet: a source (a file of endpoints, a directory of ``*.endpoint`` files or
            ``"slurm:PORT"`` inside a Slurm job, as :func:`read_fleet` reads it), or a list of
            endpoints (``"unix:/PATH"``, ``"/PATH"`` or ``"tls://HOST:PORT"``); default
            ``$RLM_SANDBOX_FLEET``.
        choices: K, the nodes asked for their capacity per placement (at least 1).
        backends: backends a node must offer (its capacity's ``features.backends``), e.g.
            ``("namespace",)``.
        server_uid: as for :class:`Server` (default ``$RLM_SANDBOX_SERVER_UID``).
        tls_cert, tls_key, tls_ca: as for :class:`Server`, for the ``tls://`` endpoints
            (default ``$RLM_SANDBOX_TLS_CERT``, ``_KEY``, ``_CA``): one client certificate and
            one CA for the whole fleet.
        seed: of the random choice of nodes (None: from the OS).
        connect_timeout: as for :class:`Server`, for the request on the node placed.
        ask_timeout: seconds for each node's capacity answer in placement and :meth:`status`,
            the connect and the whole reply (a node slower than that, or answering more than
            64 KiB, is passed over as unreachable).

    Raises:
        RlmSandboxError: no source, or one :func:`read_fleet` refuses.
        ValueError: no endpoints in a list, one of another kind, `choices` below 1, or an
            `ask_timeout` that is not a positive number.
    """

    def __init__(self, fleet: Union[str, os.PathLike, Iterable[str], None] = None, *,
                 choices: int = 3, backends: Iterable[str] = (),
                 server_uid: Optional[int] = None, seed: Optional[int] = None,
                 connect_timeout: float = 10.0, ask_timeout: float = _ASK_TIMEOUT,
                 tls_cert: Optional[Union[str, os.PathLike]] = None,
                 tls_key: Optional[Union[str, os.PathLike]] = None,
                 tls_ca: Optional[Union[str, os.PathLike]] = None) -> None:
        if fleet is None:
            fleet = fleet_from_environment()
            if fleet is None:
                raise RlmSandboxError("no fleet: pass a source or endpoints, or set "
                                      "RLM_SANDBOX_FLEET")
        #: The source the endpoints were read from, a file, a directory or ``slurm:PORT`` (None
        #: for a list); refresh() reads it again.
        self.source: Optional[str] = None
        if isinstance(fleet, (str, bytes, os.PathLike)):
            self.source = os.fsdecode(os.fspath(fleet))
            endpoints = read_fleet(self.source)
        else:
            endpoints = [str(endpoint) for endpoint in fleet]
            if not endpoints:
                raise ValueError("a fleet needs at least one endpoint")
            for endpoint in endpoints:
                endpoint_socket(endpoint)
        if isinstance(choices, bool) or not isinstance(choices, int) or choices < 1:
            raise ValueError(f"a fleet's placement asks at least 1 node (choices), not "
                             f"{choices!r}")
        if isinstance(ask_timeout, bool) or not isinstance(ask_timeout, (int, float)) or \
                not math.isfinite(ask_timeout) or ask_timeout <= 0:
            raise ValueError(f"a fleet's ask_timeout is a positive number of seconds, not "
                             f"{ask_timeout!r}")
        if isinstance(backends, str):
            backends = (backends,)
        self.choices = choices
        self.backends: Tuple[str, ...] = tuple(str(backend) for backend in backends)
        self.server_uid = server_uid
        #: The TLS files for the ``tls://`` endpoints (empty strings for none given).
        self.tls: TlsFiles = tls_files(tls_cert, tls_key, tls_ca)
        self.connect_timeout = connect_timeout
        self.ask_timeout = float(ask_timeout)
        self._endpoints: Tuple[str, ...] = tuple(endpoints)
        self._random = random.Random(seed)
        self._random_lock = threading.Lock()

    @property
    def endpoints(self) -> List[str]:
        """The nodes' endpoints, in the source's order."""
        return list(self._endpoints)

    def refresh(self) -> List[str]:
        """Reads the source again (nodes that registered or left since); returns the endpoints.
        A fleet made from a list keeps its list. Placements under way keep the nodes they began
        with."""
        if self.source is not None:
            self._endpoints = tuple(read_fleet(self.source))
        return self.endpoints

    def server(self, endpoint: str) -> Server:
        """The :class:`Server` at `endpoint` (one of the fleet's, or any other)."""
        return Server(endpoint_socket(endpoint), connect_timeout=self.connect_timeout,
                      server_uid=self.server_uid, tls_cert=self.tls.cert,
                      tls_key=self.tls.key, tls_ca=self.tls.ca)

    def _capacity(self, endpoint: str) -> Any:
        """The capacity of the node at `endpoint`, within ask_timeout for the connect and the
        whole reply, and at most 64 KiB of it; RlmSandboxError past either."""
        return self.server(endpoint)._ask_within({"op": "capacity"}, "capacity",
                                                 self.ask_timeout, _MAX_CAPACITY_BYTES)

    def status(self) -> List[Dict[str, Any]]:
        """Every node's capacity (``Server.capacity()`` without ``op``, with ``endpoint``), in
        the endpoints' order; ``{"endpoint": ..., "error": ...}`` for a node that did not give
        one (in ask_timeout)."""
        nodes: List[Dict[str, Any]] = []
        for endpoint in self._endpoints:
            try:
                node = dict(self._capacity(endpoint))
                node.pop("op", None)
                node["endpoint"] = endpoint
            except RlmSandboxError as error:
                node = {"endpoint": endpoint, "error": str(error)}
            nodes.append(node)
        return nodes

    def run(self, argv: Optional[Sequence[str]] = None, *, code: Optional[str] = None,
            language: str = "python", policy: str = "default",
            overrides: Optional[Dict[str, Any]] = None,
            limits: Optional[Dict[str, Any]] = None, env: Optional[Dict[str, str]] = None,
            timeout: Optional[Union[int, float, str]] = None,
            stdin: Optional[Union[bytes, str]] = None) -> RunResult:
        """:meth:`Server.run` on a node placed for it; the result names its node
        (``RunResult.node``). A run that started on a node is never started again elsewhere:
        when that node dies under it, ServerError ``node_lost``.

        Raises:
            ServerError: ``resource_exhausted`` when no node could take it (the message says
                each one's reason); a node's other refusals (a policy it does not offer, a
                loosening) as they are, since every node would say the same.
        """
        if (argv is None) == (code is None):
            raise ValueError("give argv or code, not both and not neither")
        return self._place(lambda server: server.run(
            argv, code=code, language=language, policy=policy, overrides=overrides,
            limits=limits, env=env, timeout=timeout, stdin=stdin))

    def session(self, policy: str = "python-repl", **options: Any) -> ServerSession:
        """A :class:`ServerSession` (the options are its own) on a node placed for it; it stays
        there (``ServerSession.node``, ``session_id``; ``fork()`` opens its branches there too).
        When the node dies, the session's calls raise ServerError ``node_lost``. Raises as
        :meth:`run` does when no node takes it."""
        return self._place(lambda server: ServerSession(server, policy, **options))

    def restore_session(self, path: Union[str, os.PathLike], policy: str = "python-repl",
                        **options: Any) -> ServerSession:
        """A session placed as :meth:`session` places one, holding the state saved at `path`
        (:meth:`ServerSession.restore_from`)."""
        return self._place(lambda server: ServerSession.restore_from(path, server, policy,
                                                                     **options))

    def policy(self, name: str = "default") -> Dict[str, Any]:
        """The offered policy `name` as the first node that answers has it (the nodes of a
        fleet offer the same), a base for ``overrides``. ServerError ``unavailable`` when none
        answers."""
        why: List[str] = []
        for endpoint in self._endpoints:
            try:
                return self.server(endpoint).policy(name)
            except ServerError as error:
                if error.kind not in _PASSES_OVER:
                    raise
                why.append(f"{endpoint}: {error}")
        raise ServerError("unavailable", "no node of the fleet answered: " + "; ".join(why))

    def __repr__(self) -> str:
        where = f"source={self.source!r}" if self.source is not None else \
            f"endpoints={list(self._endpoints)!r}"
        return f"Fleet({where}, choices={self.choices}, backends={list(self.backends)!r})"

    # -- placement -------------------------------------------------------------------------------

    def _place(self, attempt: Callable[[Server], _T]) -> _T:
        """`attempt(server)` on the best node of K at random, then of K more among those left,
        until one takes it."""
        endpoints = self._endpoints  # a refresh() meanwhile does not change this placement
        left = list(range(len(endpoints)))
        passed: List[str] = []  # each node passed over, and why

        def pass_over(index: int, why: str) -> None:
            passed.append(f"{endpoints[index]}: {why}")
            left.remove(index)

        while left:
            # K of the nodes left, at random (the first K after a partial shuffle).
            k = min(self.choices, len(left))
            with self._random_lock:
                for i in range(k):
                    j = self._random.randint(i, len(left) - 1)
                    left[i], left[j] = left[j], left[i]
            best: Optional[int] = None
            best_room = -math.inf
            sampled = left[:k]
            for index in sampled:
                try:
                    capacity = self._capacity(endpoints[index])
                except RlmSandboxError as error:
                    room, why = None, f"unreachable: {error}"
                except Exception:  # noqa: BLE001 - whatever a node does, it is passed over
                    room, why = None, _MALFORMED
                else:
                    room, why = _room(capacity, self.backends)
                if room is None or not math.isfinite(room):
                    pass_over(index, why or _MALFORMED)
                elif best is None or room > best_room:
                    best, best_room = index, room
            if best is None:
                # No node picked: every node of this round was passed over, so the next round
                # samples others (or the placement ends), never the same ones forever.
                for index in sampled:
                    if index in left:
                        pass_over(index, _MALFORMED)
                continue
            try:
                return attempt(self.server(endpoints[best]))
            except ServerError as error:
                if error.kind not in _PASSES_OVER:
                    raise
                pass_over(best, str(error))
        raise ServerError("resource_exhausted",
                          "no node of the fleet could take it: " + "; ".join(passed))
